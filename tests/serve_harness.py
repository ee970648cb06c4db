"""Real ``runq serve`` processes for tests: start, wait until ready, signal, kill, restart.

Import the fixtures into a test module (or a conftest that does not shadow the root
``conftest`` module name)::

    from serve_harness import (pg_ready, pg_serve_factory, pg_setup, runq_engine,
                               runq_setup, serve_factory)
    pytestmark = pytest.mark.anyio  # at collection, or anyio re-parametrises the engine away

``runq_setup`` is one database shared by the test's servers and the test itself (SQLite file
or a fresh Postgres schema; parametrised over both engines through ``engine``).
``private_pg_setup`` (with ``private_pg_serve_factory``) is the same on a private PostgreSQL
cluster of the test's own (``private_pg``, a ``pgcluster.PgCluster``), for tests that stop,
crash or fail over the server; ``database_for(engine, workdir, store_url=...)`` builds one
on any URL (a standby pair's multi-host URL, for example).
``serve_factory(config)`` starts a server whose config is the setup's base config (store,
seal key, a free HTTP port, the test components of ``serve_handlers``) merged with
``config``, and waits until it is ready: ``READY=1`` on its ``NOTIFY_SOCKET`` (migrations
ran, claimers started), then ``GET /healthz`` answering 200 when the HTTP API is present.
Every server is stopped at the end of the test; a server's log is in the failure report.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from helpers import wait_for
from pgcluster import PgCluster, PgClusterFactory

from runq.config import Config, load_config
from runq.seal import generate_key

TESTS_DIR = Path(__file__).resolve().parent


def _root_conftest() -> Any:
    """tests/conftest.py as a module, whichever ``conftest`` is importable by name here
    (a sub-directory conftest that imports this harness would shadow it)."""
    path = TESTS_DIR / "conftest.py"
    loaded = sys.modules.get("conftest")
    if loaded is not None and Path(getattr(loaded, "__file__", "")).resolve() == path:
        return loaded
    spec = importlib.util.spec_from_file_location("runq_tests_root_conftest", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_conftest = _root_conftest()
PG_URL: str = _conftest.PG_URL
drop_schema = _conftest.drop_schema
new_schema_name = _conftest.new_schema_name
require_postgres = _conftest.require_postgres
REPO_DIR = TESTS_DIR.parent
START_TIMEOUT = 30.0
STOP_TIMEOUT = 30.0

__all__ = [
    "RunqServer",
    "RunqSetup",
    "ServeFactory",
    "database_for",
    "pg_ready",
    "pg_serve_factory",
    "pg_setup",
    "private_pg",
    "private_pg_serve_factory",
    "private_pg_setup",
    "runq_engine",
    "runq_setup",
    "serve_factory",
    "servers_on",
    "sqlite_serve_factory",
    "sqlite_setup",
    "write_toml",
]


# -- config files ------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{escaped}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        inner = ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{" + inner + "}"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _toml_key(key: str) -> str:
    bare = key.replace("_", "").replace("-", "").isalnum()
    return key if bare else _toml_value(key)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _emit_table(lines: list[str], name: str, table: Mapping[str, Any]) -> None:
    scalars = {
        k: v
        for k, v in table.items()
        if not (isinstance(v, Mapping) and name != "components") and not _is_table_array(v)
    }
    if name:
        lines.append(f"[{name}]")
    for key, value in scalars.items():
        lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    for key, value in table.items():
        if key in scalars:
            continue
        sub = f"{name}.{_toml_key(key)}" if name else _toml_key(key)
        if _is_table_array(value):
            for item in value:
                lines.append(f"[[{sub}]]")
                lines.extend(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in item.items())
        else:
            _emit_table(lines, sub, value)


def write_toml(path: Path, data: Mapping[str, Any]) -> Path:
    """A small TOML writer for config dicts (sections, scalars, lists, inline tables)."""
    lines: list[str] = []
    _emit_table(lines, "", data)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = dict(base)
    for key, value in override.items():
        current = merged.get(key)
        if isinstance(current, Mapping) and isinstance(value, Mapping):
            merged[key] = deep_merge(current, value)
        else:
            merged[key] = value
    return merged


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api_available() -> bool:
    """True once the HTTP API (runq/api/app.py) exists; until then servers serve no HTTP."""
    return importlib.util.find_spec("runq.api.app") is not None


# -- one database for a test ---------------------------------------------------------------


class RunqSetup:
    """The database a test's servers share, and the base config that points at it."""

    def __init__(self, engine: str, workdir: Path, *, store_url: str | None = None) -> None:
        self.engine = engine
        self.workdir = workdir
        self.key_file = workdir / "seal.key"
        self.key_file.write_text(generate_key() + "\n", encoding="utf-8")
        self.key_file.chmod(0o600)
        if engine == "postgres":
            self.schema = new_schema_name()
            self.store_url = store_url or PG_URL
        else:
            self.schema = "runq"
            self.store_url = f"sqlite:///{workdir / 'runq.db'}"

    def base_config(self) -> dict[str, Any]:
        return {
            "store": {"url": self.store_url, "schema": self.schema},
            "seal": {"keys": [f"file:{self.key_file}"]},
            "components": {
                "task/record": "serve_handlers:record",
                "task/ledger": "serve_handlers:ledger",
                "task/block": "serve_handlers:block",
                "task/slow": "serve_handlers:slow",
                "task/approve": "serve_handlers:approve",
                "task/flaky": "serve_handlers:flaky",
                "task/spend": "serve_handlers:spend",
                "task/half_written": "serve_handlers:half_written",
                "task/swallow": "serve_handlers:swallow",
            },
        }

    def config_dict(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return deep_merge(self.base_config(), overrides or {})

    def write_config(self, overrides: Mapping[str, Any] | None = None, name: str = "") -> Path:
        name = name or f"runq-{secrets.token_hex(3)}.toml"
        return write_toml(self.workdir / name, self.config_dict(overrides))

    def load(self, overrides: Mapping[str, Any] | None = None) -> Config:
        """The same config as a Config object, for a Queue in the test process."""
        return load_config(self.write_config(overrides), environ={})

    @asynccontextmanager
    async def queue(self, overrides: Mapping[str, Any] | None = None) -> AsyncIterator[Any]:
        """A ``runq.Queue`` in the test process on the same database (migrated)."""
        if str(TESTS_DIR) not in sys.path:
            sys.path.insert(0, str(TESTS_DIR))  # so serve_handlers resolves here as well
        from runq.queue import Queue

        async with Queue.open(config=self.load(overrides)) as q:
            yield q

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for a ``runq`` subprocess: no RUNQ_* leaks from the test's shell."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNQ_")}
        paths = [str(TESTS_DIR), str(REPO_DIR), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        env["RUNQ_TEST_WORKDIR"] = str(self.workdir)
        env.update(extra or {})
        return env

    def run_cli(
        self, *args: str, config: Path | None = None, timeout: float = 60.0, input: str = ""
    ) -> subprocess.CompletedProcess[str]:
        """``python -m runq ARGS --config FILE`` to completion (blocking; call via to_thread)."""
        cfg = config or self.write_config()
        return subprocess.run(
            [sys.executable, "-m", "runq", *args, "--config", str(cfg)],
            cwd=self.workdir,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            check=False,
        )

    async def cli(
        self,
        *args: str,
        config: Path | None = None,
        timeout: float = 60.0,  # noqa: ASYNC109 - passed to subprocess.run
    ) -> Any:
        return await anyio.to_thread.run_sync(
            lambda: self.run_cli(*args, config=config, timeout=timeout)
        )

    async def cleanup(self) -> None:
        # A private cluster goes with its directory; only the shared server keeps schemas.
        if self.engine == "postgres" and self.store_url == PG_URL:
            await drop_schema(self.schema)


# -- one server process ----------------------------------------------------------------------


class RunqServer:
    """One ``runq serve`` subprocess with its own config file, port, log file and notify socket."""

    def __init__(
        self,
        setup: RunqSetup,
        config: Mapping[str, Any],
        *,
        env: Mapping[str, str] | None,
        prefix: Sequence[str] = (),
    ) -> None:
        self.setup = setup
        #: A command the server runs under (it must exec it): ``unshare ...``, for example.
        self.prefix = list(prefix)
        self.name = f"serve-{secrets.token_hex(3)}"
        http = dict(config.get("http", {}))
        if "listen" not in http:
            http["listen"] = f"127.0.0.1:{free_port()}"
        self.config = setup.config_dict(deep_merge(config, {"http": http}))
        self.listen: str = http["listen"]
        self.config_path = write_toml(setup.workdir / f"{self.name}.toml", self.config)
        self.log_path = setup.workdir / f"{self.name}.log"
        self.extra_env = dict(env or {})
        self.notifications: list[str] = []
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._notify: socket.socket | None = None
        self._notify_name = ""

    @property
    def url(self) -> str:
        return f"http://{self.listen}"

    @property
    def pid(self) -> int:
        assert self.process is not None, "server not started"
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def logs(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def _open_notify_socket(self) -> None:
        # An abstract socket: no path-length limit and nothing to clean up. A reader thread
        # empties it continuously: the kernel queues only a few datagrams, and a full queue
        # would make the server drop READY/STOPPING/WATCHDOG messages.
        self._notify_name = f"@runq-test-{secrets.token_hex(6)}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind("\0" + self._notify_name[1:])
        sock.settimeout(0.1)
        self._notify = sock
        self._reader = threading.Thread(target=self._read_notifications, daemon=True)
        self._reader.start()

    def _read_notifications(self) -> None:
        while self._notify is not None:
            try:
                data = self._notify.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.notifications.extend(data.decode().splitlines())

    def drain_notifications(self) -> list[str]:
        """Every message the server sent so far (READY=1, STOPPING=1, WATCHDOG=1...)."""
        with self._lock:
            return list(self.notifications)

    async def start(self, *, wait_ready: bool = True) -> RunqServer:
        if self._notify is None:
            self._open_notify_socket()
        with self._lock:
            self.notifications.clear()
        env = self.setup.env({"NOTIFY_SOCKET": self._notify_name, **self.extra_env})
        cmd = [*self.prefix, sys.executable, "-m", "runq", "serve"]
        cmd += ["--config", str(self.config_path)]
        cmd += ["--log-format", "json"]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                cmd, cwd=self.setup.workdir, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        if wait_ready:
            await self.wait_ready()
        return self

    async def wait_ready(self, timeout: float = START_TIMEOUT) -> None:  # noqa: ASYNC109
        def ready() -> bool:
            if self.returncode is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.returncode} before it was ready:\n"
                    + self.logs()[-4000:]
                )
            return "READY=1" in self.drain_notifications()

        try:
            await wait_for(ready, timeout=timeout, message=f"{self.name} sends READY=1")
            if self.config.get("http", {}).get("listen") and api_available():
                await wait_for(self._healthy, timeout=timeout, message=f"{self.name} /healthz")
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- {self.name} log ---\n{self.logs()[-4000:]}") from e

    async def _healthy(self) -> bool:
        try:
            async with httpx.AsyncClient(timeout=2.0) as client:
                response = await client.get(f"{self.url}/healthz")
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def send(self, sig: signal.Signals) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    async def wait_exit(self, timeout: float = STOP_TIMEOUT) -> int:  # noqa: ASYNC109
        def exited() -> bool:
            return self.returncode is not None

        await wait_for(exited, timeout=timeout, message=f"{self.name} exits")
        assert self.process is not None
        return self.process.returncode

    async def terminate(self, timeout: float = STOP_TIMEOUT) -> int:  # noqa: ASYNC109
        """SIGTERM (a graceful drain) and wait for the exit code."""
        self.send(signal.SIGTERM)
        return await self.wait_exit(timeout)

    def kill(self) -> None:
        """SIGKILL: no drain, no cleanup; leases stay until the reaper settles them."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    async def restart(self) -> RunqServer:
        if self.returncode is None:
            await self.terminate()
        return await self.start()

    def postgres_client_ports(self, server_port: int = 5432) -> list[int]:
        """Local TCP ports of this server's connections to PostgreSQL (at ``server_port``),
        read from /proc: ``pg_stat_activity.client_port`` then names exactly its sessions."""
        inodes = set()
        for fd in Path(f"/proc/{self.pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
        ports = []
        for table in ("tcp", "tcp6"):
            with contextlib.suppress(OSError):
                lines = Path(f"/proc/{self.pid}/net/{table}").read_text().splitlines()[1:]
                for line in lines:
                    fields = line.split()
                    local, remote, inode = fields[1], fields[2], fields[9]
                    if inode in inodes and int(remote.rsplit(":", 1)[1], 16) == server_port:
                        ports.append(int(local.rsplit(":", 1)[1], 16))
        return ports

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.url, timeout=10.0) as client:
            return await client.request(method, path, **kwargs)

    async def claim_passes(self) -> int:
        """The claim passes this server has finished (``runq_claim_passes_total``)."""
        metrics = (await self.request("GET", "/metrics")).text
        for line in metrics.splitlines():
            if line.startswith("runq_claim_passes_total "):
                return int(float(line.split()[1]))
        raise AssertionError("runq_claim_passes_total is not on /metrics")

    async def wait_for_claim_passes(self, passes: int, *, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        """Return once ``passes`` more claim passes have finished than when called: what
        a test waits on to show that claims happened and took nothing, instead of a sleep."""
        wanted = await self.claim_passes() + passes

        async def done() -> bool:
            return await self.claim_passes() >= wanted

        await wait_for(done, timeout=timeout, message=f"{passes} more claim passes")

    def close(self) -> None:
        self.kill()
        sock, self._notify = self._notify, None
        if sock is not None:
            sock.close()


class ServeFactory:
    """``await factory(config)`` starts one more server on the setup's database."""

    def __init__(self, setup: RunqSetup) -> None:
        self.setup = setup
        self.servers: list[RunqServer] = []

    async def __call__(
        self,
        config: Mapping[str, Any] | None = None,
        *,
        env: Mapping[str, str] | None = None,
        wait_ready: bool = True,
        prefix: Sequence[str] = (),
    ) -> RunqServer:
        server = RunqServer(self.setup, config or {}, env=env, prefix=prefix)
        self.servers.append(server)
        return await server.start(wait_ready=wait_ready)

    async def stop_all(self) -> None:
        for server in self.servers:
            if server.returncode is None:
                server.send(signal.SIGTERM)

        def all_exited() -> bool:
            return all(s.returncode is not None for s in self.servers)

        with contextlib.suppress(AssertionError):
            await wait_for(all_exited, timeout=10, message="servers exit")
        for server in self.servers:
            server.close()

    def report(self) -> str:
        parts = [f"--- {s.name} ({s.config_path}) ---\n{s.logs()[-6000:]}" for s in self.servers]
        return "\n".join(parts)


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture
def runq_engine(engine: str) -> str:
    """``engine`` (parametrised in conftest), with Postgres checked (or skipped) first.
    Sync on purpose: the reachability probe runs its own event loop."""
    if engine == "postgres":
        require_postgres()
    return engine


@pytest.fixture
def pg_ready() -> None:
    require_postgres()


@asynccontextmanager
async def database_for(
    engine: str, workdir: Path, *, store_url: str | None = None
) -> AsyncIterator[RunqSetup]:
    """One test's database on ``engine``, dropped afterwards (a Postgres schema); on
    PostgreSQL at ``store_url`` when given, else at the shared server."""
    setup = RunqSetup(engine, workdir, store_url=store_url)
    try:
        yield setup
    finally:
        await setup.cleanup()


@asynccontextmanager
async def servers_on(setup: RunqSetup) -> AsyncIterator[ServeFactory]:
    """Start servers on ``setup``; all are stopped afterwards and their logs printed
    (captured output: pytest shows it only when the test failed)."""
    factory = ServeFactory(setup)
    try:
        yield factory
    finally:
        await factory.stop_all()
        print(factory.report())


@pytest.fixture
async def runq_setup(runq_engine: str, tmp_path: Path) -> AsyncIterator[RunqSetup]:
    """One database per test, on each engine."""
    async with database_for(runq_engine, tmp_path) as setup:
        yield setup


@pytest.fixture
async def pg_setup(pg_ready: None, tmp_path: Path) -> AsyncIterator[RunqSetup]:
    """A Postgres-only setup (replicas sharing one database, LISTEN/NOTIFY)."""
    async with database_for("postgres", tmp_path) as setup:
        yield setup


@pytest.fixture
async def sqlite_setup(tmp_path: Path) -> AsyncIterator[RunqSetup]:
    """A SQLite-only setup (the embedded engine's own faults, CLI behaviour)."""
    async with database_for("sqlite", tmp_path) as setup:
        yield setup


@pytest.fixture
async def serve_factory(runq_setup: RunqSetup) -> AsyncIterator[ServeFactory]:
    async with servers_on(runq_setup) as factory:
        yield factory


@pytest.fixture
async def pg_serve_factory(pg_setup: RunqSetup) -> AsyncIterator[ServeFactory]:
    """``serve_factory`` on a Postgres-only setup."""
    async with servers_on(pg_setup) as factory:
        yield factory


@pytest.fixture
async def sqlite_serve_factory(sqlite_setup: RunqSetup) -> AsyncIterator[ServeFactory]:
    """``serve_factory`` on a SQLite-only setup."""
    async with servers_on(sqlite_setup) as factory:
        yield factory


@pytest.fixture
async def private_pg(pg_clusters: PgClusterFactory) -> PgCluster:
    """A private PostgreSQL cluster of this test, started (``tests/pgcluster.py``)."""
    return await pg_clusters.start()


@pytest.fixture
async def private_pg_setup(private_pg: PgCluster, tmp_path: Path) -> AsyncIterator[RunqSetup]:
    """A Postgres setup on ``private_pg``: the test may stop, crash or restart it."""
    async with database_for("postgres", tmp_path, store_url=private_pg.url) as setup:
        yield setup


@pytest.fixture
async def private_pg_serve_factory(private_pg_setup: RunqSetup) -> AsyncIterator[ServeFactory]:
    """``serve_factory`` on ``private_pg_setup``."""
    async with servers_on(private_pg_setup) as factory:
        yield factory
