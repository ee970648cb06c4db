"""What every command shares: the global options, the config and queue they open, and how
an error becomes one line and an exit code."""

from __future__ import annotations

import functools
import json
import logging
import sys
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import anyio
import click
from click.core import ParameterSource

from runq.components import ComponentRegistry
from runq.config import Config, load_config, store_engine
from runq.errors import ConfigError, RunqError, StoreUnavailable
from runq.log import configure_logging
from runq.model import Actor
from runq.store import sqlite_path

if TYPE_CHECKING:
    from runq.ops.operations import Operations
    from runq.queue import Queue
    from runq.store.base import Store

T = TypeVar("T")

EXIT_UNHEALTHY = 1
EXIT_USAGE = 2


class CliContext:
    """What every command gets: how to load the config and how to open the queue."""

    def __init__(self, config_path: str | None, store_url: str | None, debug: bool) -> None:
        self.config_path = config_path
        self.store_url = store_url
        self.debug = debug
        self._config: Config | None = None

    @property
    def config(self) -> Config:
        if self._config is None:
            self._config = load_config(self.config_path, store_url=self.store_url)
        return self._config

    def queue(
        self, *, migrate: bool = False, components: bool = False, create: bool = False
    ) -> AbstractAsyncContextManager[Queue]:
        """``Queue.open``; ``components`` resolves ``[components]`` (only producers need it).

        Without ``create``, a SQLite database that does not exist is refused before anything
        is opened: a mistyped path must not leave a directory, a key file and a fresh empty
        queue behind (and a worker on it must not wait forever for runs that never come)."""
        from runq.queue import Queue

        if not create:
            refuse_missing_database(self.config)
        registry = None if components else ComponentRegistry({})
        return Queue.open(config=self.config, migrate=migrate, components=registry)

    @asynccontextmanager
    async def store(self, *, migrate: bool = False, create: bool = False) -> AsyncIterator[Store]:
        """The configured store, for the commands that host a service on it (work, reap,
        purge) and for the operator's side; refuses a missing SQLite database unless
        ``create``, as ``queue`` does."""
        from runq.store import open_store

        if not create:
            refuse_missing_database(self.config)
        async with open_store(self.config) as store:
            if migrate:
                await store.migrate()
            yield store

    @asynccontextmanager
    async def operations(self) -> AsyncIterator[Operations]:
        """The operator's side of the configured store (``runq.ops``): reads, pauses and
        schedules."""
        from runq.ops.operations import Operations

        async with self.store() as store:
            yield Operations(store, self.config)

    @asynccontextmanager
    async def both(self) -> AsyncIterator[tuple[Queue, Operations]]:
        """The producer and the operator's side on one store (find a run, then act on it)."""
        from runq.ops.operations import Operations
        from runq.queue import Queue

        async with (
            self.store() as store,
            Queue.on(store, self.config, ComponentRegistry({})) as queue,
        ):
            yield queue, Operations(store, self.config)

    @property
    def cli_actor(self) -> Actor:
        return Actor(user_id=self.config.cli.service_account, service_account=True)


def refuse_missing_database(config: Config) -> None:
    if store_engine(config.store.url) != "sqlite":
        return
    path = sqlite_path(config.store.url)
    if str(path) != ":memory:" and not path.exists():
        raise StoreUnavailable(
            f"SQLite database {path} does not exist (check --store-url / [store] url; "
            "`runq migrate` creates it)"
        )


def leaf_errors(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from leaf_errors(inner)
    else:
        yield error


def first_error(error: BaseException, kind: type[BaseException]) -> BaseException | None:
    return next((e for e in leaf_errors(error) if isinstance(e, kind)), None)


def _exit_for(error: BaseException, debug: bool) -> NoReturn:
    """One line for what the operator can act on; a traceback only with --debug."""
    if debug:
        traceback.print_exception(error)
    config_error = first_error(error, ConfigError)
    if config_error is not None:
        click.echo(f"runq: configuration error: {config_error}", err=True)
        sys.exit(EXIT_USAGE)
    unavailable = first_error(error, StoreUnavailable)
    if unavailable is not None:
        click.echo(f"runq: database unavailable: {unavailable}", err=True)
        sys.exit(1)
    runq_error = first_error(error, RunqError)
    if runq_error is not None:
        click.echo(f"runq: {runq_error}", err=True)
        sys.exit(1)
    leaf = next(leaf_errors(error))
    click.echo(f"runq: {type(leaf).__name__}: {leaf}", err=True)
    sys.exit(1)


def run_async(fn: Callable[[], Awaitable[T]]) -> T:
    options: dict[str, Any] = {}
    if sys.platform == "linux":
        options["use_uvloop"] = True
    return anyio.run(fn, backend="asyncio", backend_options=options)


class GlobalOptions:
    """The options given before the command's name (``runq --config x status``)."""

    def __init__(
        self, config_path: str | None, store_url: str | None, debug: bool, log_format: str | None
    ) -> None:
        self.config_path = config_path
        self.store_url = store_url
        self.debug = debug
        self.log_format = log_format


def shared_options(fn: Callable[..., Any], *, on_group: bool = False) -> Callable[..., Any]:
    """``--config``, ``--store-url``, ``--debug``, ``--log-format``: on the group and on
    every command, so they work before or after the command's name. The group reads no
    environment variable: the command does, and an option given on the command line in
    either place wins over it."""
    options = [
        click.option(
            "--config",
            "config_path",
            type=click.Path(dir_okay=False),
            envvar=None if on_group else "RUNQ_CONFIG",
            help="TOML configuration file (also RUNQ_CONFIG).",
        ),
        click.option(
            "--store-url",
            envvar=None if on_group else "RUNQ_STORE_URL",
            help="Database URL (also RUNQ_STORE_URL).",
        ),
        click.option("--debug", is_flag=True, help="Debug logging and tracebacks."),
        click.option(
            "--log-format",
            type=click.Choice(["auto", "json", "text"]),
            default=None if on_group else "auto",
            show_default=not on_group,
            help="Log lines: JSON when not a TTY (auto), or forced.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _with_global(name: str, value: Any) -> Any:
    """A command's option value, or the one given before the command's name when the
    command's own came only from the environment or the default."""
    ctx = click.get_current_context()
    given = ctx.find_root().obj
    if not isinstance(given, GlobalOptions):
        return value
    if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
        return value
    before = getattr(given, name)
    return value if before is None else before


def common_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adds the options every command takes and turns errors into one line + exit code."""

    @shared_options
    @functools.wraps(fn)
    def wrapper(
        config_path: str | None, store_url: str | None, debug: bool, log_format: str, **kwargs: Any
    ) -> Any:
        config_path = _with_global("config_path", config_path)
        store_url = _with_global("store_url", store_url)
        log_format = _with_global("log_format", log_format)
        debug = debug or _with_global("debug", False) is True
        quiet = fn.__name__ not in ("serve_cmd", "work_cmd")
        level = logging.WARNING if quiet else logging.INFO
        configure_logging(log_format, debug=debug, level=level)  # type: ignore[arg-type]
        cli = CliContext(config_path, store_url, debug)
        try:
            return fn(cli, **kwargs)
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                sys.exit(130)
            _exit_for(e, debug)

    return wrapper


def read_json_arg(value: str, name: str) -> Any:
    """``JSON``, ``@FILE`` or ``-`` (stdin)."""
    if value == "-":
        text = sys.stdin.read()
    elif value.startswith("@"):
        try:
            text = Path(value[1:]).read_text(encoding="utf-8")
        except OSError as e:
            raise click.BadParameter(
                f"cannot read {value[1:]}: {e.strerror}", param_hint=name
            ) from e
    else:
        text = value
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not valid JSON: {e}", param_hint=name) from e


def split_component(value: str) -> tuple[str, str]:
    ctype, sep, cid = value.partition("/")
    if not sep or not ctype or not cid:
        raise click.BadParameter("expected TYPE/ID, e.g. task/echo", param_hint="TYPE/ID")
    return ctype, cid
