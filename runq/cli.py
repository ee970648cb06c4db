"""``runq ...``: the command line.

Every command takes ``--config FILE`` (also ``RUNQ_CONFIG``), ``--store-url`` (also
``RUNQ_STORE_URL``), ``--debug`` and ``--log-format``. A configuration error prints one
line naming the key and exits 2; an unreachable database prints one line and exits 1; a
traceback appears only with ``--debug``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import anyio
import click
import msgspec

from runq.components import ComponentRegistry
from runq.config import (
    LIVE_WORKER_SECONDS,
    REAP_LIMIT,
    SWEEP_LIMIT,
    SWEEP_TIME_LIMIT_SECONDS,
    Config,
    load_config,
    redact_url,
)
from runq.errors import ConfigError, RunqError, StoreUnavailable
from runq.log import configure_logging
from runq.model import Actor, JobView, QueueHealth, Run, Status

if TYPE_CHECKING:
    from runq.queue import Queue

T = TypeVar("T")

EXIT_UNHEALTHY = 1
EXIT_USAGE = 2


# -- shared plumbing ---------------------------------------------------------------------


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
        self, *, migrate: bool = False, components: bool = False
    ) -> AbstractAsyncContextManager[Queue]:
        """``Queue.open``; ``components`` resolves ``[components]`` (only producers need it)."""
        from runq.queue import Queue

        registry = None if components else ComponentRegistry({})
        return Queue.open(config=self.config, migrate=migrate, components=registry)

    @property
    def cli_actor(self) -> Actor:
        return Actor(user_id=self.config.cli.service_account, service_account=True)


def _leaf_errors(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaf_errors(inner)
    else:
        yield error


def _first(error: BaseException, kind: type[BaseException]) -> BaseException | None:
    return next((e for e in _leaf_errors(error) if isinstance(e, kind)), None)


def _exit_for(error: BaseException, debug: bool) -> NoReturn:
    """One line for what the operator can act on; a traceback only with --debug."""
    if debug:
        traceback.print_exception(error)
    config_error = _first(error, ConfigError)
    if config_error is not None:
        click.echo(f"runq: configuration error: {config_error}", err=True)
        sys.exit(EXIT_USAGE)
    unavailable = _first(error, StoreUnavailable)
    if unavailable is not None:
        click.echo(f"runq: database unavailable: {unavailable}", err=True)
        sys.exit(1)
    runq_error = _first(error, RunqError)
    if runq_error is not None:
        click.echo(f"runq: {runq_error}", err=True)
        sys.exit(1)
    leaf = next(_leaf_errors(error))
    click.echo(f"runq: {type(leaf).__name__}: {leaf}", err=True)
    sys.exit(1)


def run_async(fn: Callable[[], Awaitable[T]]) -> T:
    options: dict[str, Any] = {}
    if sys.platform == "linux":
        options["use_uvloop"] = True
    return anyio.run(fn, backend="asyncio", backend_options=options)


def common_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Adds the options every command takes and turns errors into one line + exit code."""

    @click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        envvar="RUNQ_CONFIG",
        help="TOML configuration file (also RUNQ_CONFIG).",
    )
    @click.option(
        "--store-url", envvar="RUNQ_STORE_URL", help="Database URL (also RUNQ_STORE_URL)."
    )
    @click.option("--debug", is_flag=True, help="Debug logging and tracebacks.")
    @click.option(
        "--log-format",
        type=click.Choice(["auto", "json", "text"]),
        default="auto",
        show_default=True,
        help="Log lines: JSON when not a TTY (auto), or forced.",
    )
    @functools.wraps(fn)
    def wrapper(
        config_path: str | None, store_url: str | None, debug: bool, log_format: str, **kwargs: Any
    ) -> Any:
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


def _echo_json(value: Any) -> None:
    click.echo(msgspec.json.format(msgspec.json.encode(value), indent=2).decode())


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _console() -> Any:
    from rich.console import Console

    return Console(highlight=False)


def _read_json_arg(value: str, name: str) -> Any:
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


def _split_component(value: str) -> tuple[str, str]:
    ctype, sep, cid = value.partition("/")
    if not sep or not ctype or not cid:
        raise click.BadParameter("expected TYPE/ID, e.g. task/echo", param_hint="TYPE/ID")
    return ctype, cid


# -- the group ---------------------------------------------------------------------------


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="runq")
def cli() -> None:
    """runq: a durable queue for background runs."""


def main() -> None:
    cli(prog_name="runq")


# -- serve, migrate ----------------------------------------------------------------------


@cli.command("serve")
@common_options
def serve_cmd(cli_ctx: CliContext) -> None:
    """Run the daemon: claimers, heartbeats, reaper, retention, HTTP API."""
    from runq.serve.supervisor import run_serve
    from runq.worker.executor import live_handler_threads

    config = cli_ctx.config
    code = run_serve(config)
    if live_handler_threads():
        # A plain-function handler still blocks a thread after the drain; the process
        # must still exit (its run was settled as interrupted).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


@cli.command("migrate")
@common_options
def migrate_cmd(cli_ctx: CliContext) -> None:
    """Apply pending database migrations (safe while replicas run)."""
    from runq.store import open_store

    config = cli_ctx.config

    async def go() -> int:
        async with open_store(config) as store:
            return await store.migrate()

    applied = run_async(go)
    click.echo(f"applied {applied} migration(s) to {redact_url(config.store.url)}")


# -- enqueue, defer ----------------------------------------------------------------------


def submit_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.argument("component"),
        click.option("--payload", default=None, help="JSON, @FILE or - (stdin)."),
        click.option("--session", default=None, help="Session id (one run at a time)."),
        click.option("--user", default=None, help="Run on behalf of this user id."),
        click.option("--idempotency-key", default=None),
        click.option("--max-attempts", type=click.IntRange(min=1), default=None),
        click.option("--deployment", default=None, help="Pin to a deployment id."),
        click.option(
            "--priority", type=int, default=0, show_default=True, help="Lower runs first."
        ),
        click.option("--delay", type=click.FloatRange(min=0), default=0.0, help="Seconds."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _submit(cli_ctx: CliContext, background: bool, **opts: Any) -> None:
    ctype, cid = _split_component(opts["component"])
    payload = _read_json_arg(opts["payload"], "--payload") if opts["payload"] is not None else None
    actor = Actor(user_id=opts["user"]) if opts["user"] else cli_ctx.cli_actor

    async def go() -> Run:
        async with cli_ctx.queue(migrate=True, components=True) as q:
            new = q.new_run(
                ctype,
                cid,
                payload,
                session_id=opts["session"],
                actor=actor,
                idempotency_key=opts["idempotency_key"],
                max_attempts=opts["max_attempts"],
                deployment_id=opts["deployment"],
                priority=opts["priority"],
                delay_seconds=opts["delay"],
                origin="cli",
            )
            result, run = await q.submit(new, background=background)
            final: Run = run if run is not None else result.run
            return final

    _echo_json(run_async(go))


@cli.command("enqueue")
@submit_options
@common_options
def enqueue_cmd(cli_ctx: CliContext, **opts: Any) -> None:
    """Store a run and dispatch it (on a sync route: execute it here). Prints the run."""
    _submit(cli_ctx, False, **opts)


@cli.command("defer")
@submit_options
@common_options
def defer_cmd(cli_ctx: CliContext, **opts: Any) -> None:
    """Store a run for a sweep or a daemon; never executes here. Prints the run."""
    _submit(cli_ctx, True, **opts)


# -- work, reap, purge -------------------------------------------------------------------


@cli.command("work")
@click.option("--limit", type=click.IntRange(min=1), default=SWEEP_LIMIT, show_default=True)
@click.option(
    "--time-limit",
    type=click.FloatRange(min=0),
    default=SWEEP_TIME_LIMIT_SECONDS,
    show_default=True,
)
@click.option("--json", "as_json", is_flag=True)
@common_options
def work_cmd(cli_ctx: CliContext, limit: int, time_limit: float, as_json: bool) -> None:
    """One bounded sweep for cron: oldest first. Exit 0 even when runs failed; 1 when the
    queue cannot be read."""
    from runq.worker.claimer import SweepReport, sweep
    from runq.worker.runtime import WorkerRuntime

    config = cli_ctx.config

    async def go() -> SweepReport:
        async with cli_ctx.queue(migrate=True, components=True) as q:
            runtime = WorkerRuntime(store=q.store, config=config, components=q.components)
            return await sweep(
                q.store,
                runtime,
                limit=limit,
                time_limit=time_limit,
                deployment_id=config.queue.deployment,
                serialize_sessions=config.queue.serialize_sessions,
            )

    report = run_async(go)
    if as_json:
        _echo_json(report.as_dict())
        return
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(report.outcomes.items())) or "none"
    click.echo(
        f"claimed {report.claimed} run(s) in {report.seconds:.2f}s ({outcomes}); "
        f"stopped: {report.stopped_by}"
    )


@cli.command("reap")
@click.option(
    "--limit", type=int, default=REAP_LIMIT, show_default=True, help="At most this many (1-10000)."
)
@click.option("--json", "as_json", is_flag=True)
@common_options
def reap_cmd(cli_ctx: CliContext, limit: int, as_json: bool) -> None:
    """Settle running runs whose lease is stale: requeue or dead-letter."""
    if not 1 <= limit <= 10_000:
        click.echo(f"runq: --limit {limit} must be between 1 and 10000", err=True)
        sys.exit(EXIT_USAGE)
    from runq.maintenance.reaper import Reaper, ReaperConfig

    config = cli_ctx.config

    async def go() -> Any:
        async with cli_ctx.queue() as q:
            notifier = q.notifier
            reaper = Reaper(
                q.store,
                ReaperConfig.from_config(config, limit=limit),
                on_requeued=notifier.request_wake if notifier is not None else None,
            )
            return await reaper.run_once()

    report = run_async(go)
    if as_json:
        _echo_json(report)
        return
    click.echo(f"requeued: {report.requeued}")
    click.echo(f"dead-lettered: {report.dead_lettered}")
    click.echo(f"skipped: {report.skipped}")


@cli.command("purge")
@click.option("--json", "as_json", is_flag=True)
@common_options
def purge_cmd(cli_ctx: CliContext, as_json: bool) -> None:
    """Delete final runs older than retention_seconds (what the daemon does hourly)."""
    from runq.maintenance.retention import Retention, RetentionConfig

    config = cli_ctx.config

    async def go() -> Any:
        async with cli_ctx.queue() as q:
            retention = Retention(q.store, RetentionConfig.from_config(config))
            return await retention.run_once()

    report = run_async(go)
    if as_json:
        _echo_json(report)
    else:
        click.echo(f"deleted: {report.deleted}")


# -- status ------------------------------------------------------------------------------


def _problems(health: QueueHealth, *, max_queue_wait: float, minimum_workers: int) -> list[str]:
    problems = []
    if health.expired_leases:
        problems.append(f"{health.expired_leases} running run(s) have an expired lease")
    age = health.oldest_queued_age_seconds
    if age is not None and age > max_queue_wait:
        problems.append(f"the oldest queued run has waited {age:.0f}s (> {max_queue_wait:g}s)")
    if health.live_workers < minimum_workers:
        problems.append(f"{health.live_workers} live worker(s) (< {minimum_workers})")
    return problems


def _print_status(health: QueueHealth, problems: list[str]) -> None:
    from rich.table import Table

    table = Table(title="runq status", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    for status in Status:
        table.add_row(status.value, str(health.counts.get(status.value, 0)))
    age = health.oldest_queued_age_seconds
    table.add_row("oldest queued wait", "-" if age is None else f"{age:.1f}s")
    for deployment, dep_age in sorted(health.oldest_queued_age_by_deployment.items()):
        table.add_row(f"  deployment {deployment or '(none)'}", f"{dep_age:.1f}s")
    table.add_row("expired leases", str(health.expired_leases))
    table.add_row("live workers", str(health.live_workers))
    console = _console()
    console.print(table)
    if problems:
        for problem in problems:
            console.print(f"[red]unhealthy:[/red] {problem}")
    else:
        console.print("[green]healthy[/green]")


@cli.command("status")
@click.option("--json", "as_json", is_flag=True)
@click.option("--max-queue-wait", type=float, default=300.0, show_default=True)
@click.option("--minimum-workers", type=int, default=1, show_default=True)
@click.option("--worker-max-age", type=float, default=LIVE_WORKER_SECONDS, show_default=True)
@common_options
def status_cmd(
    cli_ctx: CliContext,
    as_json: bool,
    max_queue_wait: float,
    minimum_workers: int,
    worker_max_age: float,
) -> None:
    """Queue health. Exit 0 healthy, 1 unhealthy or database unreadable, 2 bad arguments."""
    bad = []
    if max_queue_wait < 0:
        bad.append("--max-queue-wait must be >= 0")
    if minimum_workers < 0:
        bad.append("--minimum-workers must be >= 0")
    if worker_max_age <= 0:
        bad.append("--worker-max-age must be > 0")
    if bad:
        click.echo("runq: " + "; ".join(bad), err=True)
        sys.exit(EXIT_USAGE)
    lock_grace = cli_ctx.config.queue.lock_grace_seconds

    async def go() -> QueueHealth:
        async with cli_ctx.queue() as q:
            result: QueueHealth = await q.store.health(
                lock_grace_seconds=lock_grace, worker_max_age_seconds=worker_max_age
            )
            return result

    try:
        health = run_async(go)
    except BaseException as e:
        if _first(e, ConfigError) is not None or isinstance(e, KeyboardInterrupt):
            raise
        # Any failure to read is "unhealthy", with one line saying why.
        leaf = next(_leaf_errors(e))
        if cli_ctx.debug:
            traceback.print_exception(e)
        click.echo(f"runq: database unreadable: {leaf}", err=True)
        sys.exit(EXIT_UNHEALTHY)
    problems = _problems(health, max_queue_wait=max_queue_wait, minimum_workers=minimum_workers)
    if as_json:
        body = msgspec.to_builtins(health)
        _echo_json({"healthy": not problems, "problems": problems, **body})
    else:
        _print_status(health, problems)
    sys.exit(EXIT_UNHEALTHY if problems else 0)


# -- jobs --------------------------------------------------------------------------------


@cli.group("jobs")
def jobs() -> None:
    """List, show, requeue, cancel and continue runs (the /queue operator surface)."""


def _job_row(run: Run) -> list[str]:
    error = (run.error or "")[:60]
    return [
        run.id,
        run.component,
        run.status.value,
        f"{run.attempt}/{run.max_attempts}",
        _when(run.created_at),
        error,
    ]


@jobs.command("list")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice([s.value for s in Status]),
    help="Repeat to match several.",
)
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--page", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--sort-by", default="created_at", show_default=True)
@click.option("--sort-order", type=click.Choice(["asc", "desc"]), default="desc", show_default=True)
@click.option("--user", default=None, help="Only this user's runs.")
@click.option("--json", "as_json", is_flag=True)
@common_options
def jobs_list(cli_ctx: CliContext, **opts: Any) -> None:
    """Runs, newest first by default."""

    async def go() -> Any:
        async with cli_ctx.queue() as q:
            return await q.list_jobs(
                statuses=[Status(s) for s in opts["statuses"]],
                page=opts["page"],
                limit=opts["limit"],
                sort_by=opts["sort_by"],
                sort_order=opts["sort_order"],
                user_id=opts["user"],
            )

    page = run_async(go)
    if opts["as_json"]:
        data = [JobView.from_run(r) for r in page.data]
        meta = {
            "page": page.page,
            "limit": page.limit,
            "total_count": page.total_count,
            "total_pages": page.total_pages,
        }
        _echo_json({"data": data, "meta": meta})
        return
    from rich.table import Table

    table = Table("id", "component", "status", "attempt", "created (UTC)", "error")
    for run in page.data:
        table.add_row(*_job_row(run))
    console = _console()
    console.print(table)
    console.print(f"page {page.page} of {max(page.total_pages, 1)} ({page.total_count} runs)")


async def _one(cli_ctx: CliContext, verb: Callable[[Any], Awaitable[Run | None]]) -> Run | None:
    async with cli_ctx.queue() as q:
        return await verb(q)


def _print_run(run: Run, as_json: bool) -> None:
    if as_json:
        _echo_json(run)
        return
    from rich.table import Table

    table = Table(show_header=False)
    table.add_column("field")
    table.add_column("value")
    view = msgspec.to_builtins(JobView.from_run(run))
    view["answer"] = run.answer
    for key, value in view.items():
        if key.endswith("_at") and isinstance(value, int | float):
            value = f"{_when(value)} ({value:.3f})"
        elif isinstance(value, dict | list):
            value = json.dumps(value)[:500]
        table.add_row(key, "-" if value is None else str(value))
    _console().print(table)


@jobs.command("show")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
@common_options
def jobs_show(cli_ctx: CliContext, run_id: str, as_json: bool) -> None:
    """One run, all fields."""
    run = run_async(lambda: _one(cli_ctx, lambda q: q.get(run_id)))
    if run is None:
        click.echo(f"runq: no run {run_id}", err=True)
        sys.exit(1)
    _print_run(run, as_json)


@jobs.command("requeue")
@click.argument("run_id")
@click.option("--clear-cancellation", is_flag=True, help="Also clear a recorded cancel.")
@click.option("--force", is_flag=True, help="Even within lock_grace_seconds of its failure.")
@click.option("--json", "as_json", is_flag=True)
@common_options
def jobs_requeue(
    cli_ctx: CliContext, run_id: str, clear_cancellation: bool, force: bool, as_json: bool
) -> None:
    """Give a failed or cancelled run one more attempt."""
    run = run_async(
        lambda: _one(
            cli_ctx,
            lambda q: q.requeue(run_id, clear_cancellation=clear_cancellation, force=force),
        )
    )
    assert run is not None
    _report(run, as_json)


@jobs.command("cancel")
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
@common_options
def jobs_cancel(cli_ctx: CliContext, run_id: str, as_json: bool) -> None:
    """Cancel a run (a running one stops at its next checkpoint or heartbeat)."""
    run = run_async(lambda: _one(cli_ctx, lambda q: q.cancel(run_id)))
    assert run is not None
    _report(run, as_json)


@jobs.command("continue")
@click.argument("run_id")
@click.option("--decision", default="null", show_default=True, help="JSON, @FILE or -.")
@click.option("--json", "as_json", is_flag=True)
@common_options
def jobs_continue(cli_ctx: CliContext, run_id: str, decision: str, as_json: bool) -> None:
    """Continue a paused run with a decision."""
    value = _read_json_arg(decision, "--decision")
    run = run_async(lambda: _one(cli_ctx, lambda q: q.continue_(run_id, value)))
    assert run is not None
    _report(run, as_json)


def _report(run: Run, as_json: bool) -> None:
    if as_json:
        _echo_json(JobView.from_run(run))
        return
    extra = " (cancel requested)" if run.cancel_requested and run.status is Status.RUNNING else ""
    click.echo(f"{run.id} {run.status.value}{extra}")


# -- keys --------------------------------------------------------------------------------


@cli.group("keys")
def keys() -> None:
    """Seal keys: generate one, or re-seal every run under the first key."""


@keys.command("generate")
@common_options
def keys_generate(cli_ctx: CliContext) -> None:
    """Print a new random key (urlsafe base64 of 32 bytes) for seal.keys."""
    from runq.seal import generate_key

    click.echo(generate_key())


@keys.command("rotate")
@click.option("--page-size", type=click.IntRange(1, 10_000), default=500, show_default=True)
@click.option("--after", "after_id", default="", help="Resume after this run id.")
@common_options
def keys_rotate(cli_ctx: CliContext, page_size: int, after_id: str) -> None:
    """Re-seal payload, answer and resume state of every run under the first key of
    seal.keys (keep the old keys listed until this finished). Safe to run again, and
    resumable with --after."""
    from rich.progress import Progress

    from runq.store import open_store

    config = cli_ctx.config

    async def go() -> tuple[int, int, str]:
        runs = values = 0
        last = after_id
        async with open_store(config) as store:
            try:
                total = await store.count_runs()
                with Progress(transient=False) as progress:
                    task = progress.add_task("re-sealing", total=total or None)
                    while True:
                        next_id, resealed = await store.reseal_page(after_id=last, limit=page_size)
                        values += resealed
                        if next_id is None:
                            break
                        last = next_id
                        # reseal_page reports the last id, not how many rows: count pages.
                        runs = min(runs + page_size, total) if total else runs + page_size
                        progress.update(task, completed=runs)
                    progress.update(task, completed=total)
            except BaseException:
                if last:
                    click.echo(f"interrupted; resume with --after {last}", err=True)
                raise
        return runs, values, last

    started = time.monotonic()
    runs, values, last = run_async(go)
    click.echo(
        f"re-sealed {values} value(s), about {runs} run(s) scanned, "
        f"in {time.monotonic() - started:.1f}s" + (f"; last id {last}" if last else "")
    )


if __name__ == "__main__":  # pragma: no cover
    main()
