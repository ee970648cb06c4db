"""Private PostgreSQL clusters for fault tests: crash, stop, replicate and fail over a server
that belongs to the test alone, never the machine's shared one.

A test that must stop, crash or fail over PostgreSQL takes the ``pg_clusters`` fixture (a
``PgClusterFactory``) and builds what it needs::

    async def test_a_crash(pg_clusters: PgClusterFactory) -> None:
        primary = await pg_clusters.start()                  # initdb'd, running, ready
        url = primary.url                                     # postgresql://postgres@127.0.0.1:P/postgres
        await primary.stop("immediate")                       # or "fast"
        await primary.start()                                 # crash recovery, ready again
        await primary.kill()                                  # SIGKILL of the postmaster

    async def test_a_failover(pg_clusters: PgClusterFactory) -> None:
        primary = await pg_clusters.start()
        standby = await primary.add_standby()                 # pg_basebackup -R, streaming
        await primary.set_synchronous(standby)                # synchronous_standby_names
        url = multi_host_url(primary, standby)                # ...?target_session_attrs=read-write
        await primary.kill()
        await standby.promote()                               # pg_ctl promote, waits
        await primary.rejoin(standby)                         # pg_rewind -R, a standby of it

For ``runq serve`` on a private cluster, ``serve_harness`` has ``private_pg`` (a started
cluster), ``private_pg_setup`` and ``private_pg_serve_factory`` (the ``pg_*`` fixtures'
twins), and ``database_for("postgres", tmp_path, store_url=...)`` for any URL, a
multi-host one included.

Every cluster is a copy of one ``initdb`` made per test process (about 2 s once; a copy and
a start take a fraction of a second), in a directory under ``/tmp`` owned by the
``postgres`` OS user, who runs every server binary (through ``runuser`` when the tests run
as root). The postmaster is this process's child (``postgres -D``, not daemonised by
``pg_ctl``), so a SIGKILLed one is reaped and its pid never blocks the next start. A
cluster listens on ``host`` (default 127.0.0.1; two clusters may share a port on two
loopback addresses) at a free port and on a Unix socket in its own directory, with trust
authentication, ``fsync = on`` (crash drills need real durability), a small
``shared_buffers``, ``wal_level = replica`` and ``wal_log_hints = on`` (so ``pg_rewind``
works). ``settings`` passed to ``start`` (or to
``add_standby``) go to ``postgresql.auto.conf`` before the first start (for example
``{"autovacuum": "off"}``); ``configure(**settings)`` changes them on a running server
(``ALTER SYSTEM`` and a reload: this server is the test's own).

Methods that wait run their blocking part in a worker thread, so a test's producers and
probes go on meanwhile:

* ``start()``, ``stop(mode)`` (``"fast"``, ``"immediate"``, ``"smart"``), ``restart(mode)``,
  ``kill()`` (SIGKILL of the postmaster; returns once every server process is gone, so
  the next ``start`` runs crash recovery on the same directory), ``wait_ready()``.
* ``add_standby(name=, host=, port=, settings=)`` → a started streaming standby
  (``pg_basebackup -R -X stream``; its ``cluster_name`` is its ``name``, which is the
  ``application_name`` the primary sees); ``wait_streaming(standby, sync=)``;
  ``wait_caught_up(standby)``.
* ``promote()`` (``pg_ctl promote``, returns once the server accepts writes);
  ``rejoin(new_primary, method="rewind" | "basebackup")`` stops this (old) primary if it
  runs, turns it into a standby of ``new_primary`` and starts it.
* ``set_synchronous(*standbys, commit="on")`` / ``set_asynchronous()``:
  ``synchronous_standby_names`` (the standbys' names, or ``*``) and ``synchronous_commit``.
* ``execute(sql)``, ``fetchval(sql)``, ``fetch(sql)``: one short asyncpg connection each.
* ``url`` (``postgresql://postgres@HOST:PORT/postgres``), ``pid`` (the postmaster),
  ``log()`` (the server log; the factory prints every log when a test fails).

Teardown never leaves a postmaster behind: at the end of the test every cluster is
stopped the way ``-m immediate`` does (SIGQUIT), every process still working in its
directory is SIGKILLed,
and the directory is removed, whether the test passed or not. A test process that was
itself killed leaves its clusters behind; the next test process that builds a template
finds them (their owner pid is gone) and removes them the same way.

``RUNQ_TEST_PG_BINDIR`` names the server binaries (default: the newest
``/usr/lib/postgresql/*/bin``, PostgreSQL 15 on Debian 12). Where they are missing the
fixture skips, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from helpers import wait_for

__all__ = [
    "ClusterUnavailable",
    "PgCluster",
    "PgClusterFactory",
    "multi_host_url",
    "pg_clusters",
]

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
OS_USER = "postgres"
DIR_PREFIX = "runq-pg-"
#: Settings every cluster starts with (the template's postgresql.conf). Durability is real
#: (fsync on); the rest keeps a test server small and ready to replicate and rewind.
BASE_SETTINGS: dict[str, str] = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "shared_buffers": "16MB",
    "max_connections": "100",
    "wal_level": "replica",
    "max_wal_senders": "10",
    "max_replication_slots": "10",
    "wal_keep_size": "256MB",
    "max_wal_size": "256MB",
    "wal_log_hints": "on",
    "hot_standby": "on",
    "wal_receiver_status_interval": "1s",
    "log_line_prefix": "'%m [%p] %a '",
    "log_min_messages": "warning",
    "logging_collector": "off",
}
HBA = """\
local all all trust
local replication all trust
host all all 127.0.0.0/8 trust
host replication all 127.0.0.0/8 trust
"""
START_SECONDS = 60
#: pg_ctl's stop modes are these signals to the postmaster.
STOP_SIGNALS = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}
STOP_MODES = tuple(STOP_SIGNALS)


class ClusterUnavailable(Exception):
    """The machine cannot run private clusters (no server binaries, no postgres user)."""


# -- the server binaries and the OS user -------------------------------------------------------


def bindir() -> Path:
    configured = os.environ.get("RUNQ_TEST_PG_BINDIR")
    if configured:
        return Path(configured)
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name or 0))
    if not found:
        raise ClusterUnavailable("no PostgreSQL server binaries under /usr/lib/postgresql")
    return found[-1]


def _as_postgres(cmd: Sequence[str]) -> list[str]:
    """Run as the postgres OS user: the server refuses to run as root."""
    if os.geteuid() != 0:
        return list(cmd)
    return ["runuser", "-u", OS_USER, "--", *cmd]


def _run(cmd: Sequence[str], *, cwd: Path, timeout: float = 120) -> str:
    result = subprocess.run(
        _as_postgres(cmd), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd)} exited {result.returncode}: "
            f"{(result.stderr or result.stdout).strip()[-2000:]}"
        )
    return result.stdout


def _give_to_postgres(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, OS_USER, OS_USER)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# -- processes ---------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie nobody reaps counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _parent_of(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def processes_in(directory: Path) -> list[int]:
    """Processes whose working directory is ``directory`` or below it: a postmaster and
    every server process it forked work in the data directory, even orphaned ones."""
    root = str(directory.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cwd = os.readlink(entry / "cwd")
            if (cwd == root or cwd.startswith(root + "/")) and _alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def _kill_all(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait for ``pids`` to exit; the ones still alive at the deadline."""
    deadline = time.monotonic() + timeout
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [p for p in left if _alive(p)]
    return left


def _exterminate(directory: Path) -> None:
    """SIGKILL every process working in ``directory`` and wait until all are gone."""
    for _ in range(5):
        pids = processes_in(directory)
        if not pids:
            return
        _kill_all(pids)
        _wait_gone(pids, 5)


# -- the template: one initdb per test process -------------------------------------------------


def _owner_file(directory: Path) -> Path:
    return directory / "owner.pid"


def _new_workspace() -> Path:
    directory = Path(tempfile.mkdtemp(prefix=DIR_PREFIX))
    _owner_file(directory).write_text(str(os.getpid()))
    directory.chmod(0o755)
    _give_to_postgres(directory)
    return directory


def _remove_workspace(directory: Path) -> None:
    _exterminate(directory)
    shutil.rmtree(directory, ignore_errors=True)


def sweep_abandoned() -> list[Path]:
    """Remove the clusters of test processes that died without tearing down (SIGKILLed
    pytest, a lost CI runner): their servers are killed and their directories deleted."""
    removed = []
    for directory in Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*"):
        try:
            owner = int(_owner_file(directory).read_text())
        except (OSError, ValueError):
            continue
        if owner != os.getpid() and not _alive(owner):
            _remove_workspace(directory)
            removed.append(directory)
    return removed


class _Template:
    """One initdb per process, copied for every cluster."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workspace: Path | None = None

    @property
    def data(self) -> Path:
        with self._lock:
            if self._workspace is None:
                sweep_abandoned()
                self._workspace = self._build()
                atexit.register(_remove_workspace, self._workspace)
            return self._workspace / "data"

    @staticmethod
    def _build() -> Path:
        workspace = _new_workspace()
        data = workspace / "data"
        _run(
            [
                str(bindir() / "initdb"),
                "-D",
                str(data),
                "--auth=trust",
                "--username=postgres",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",  # the template itself need not survive a power loss
            ],
            cwd=workspace,
        )
        settings = "".join(f"{key} = {value}\n" for key, value in BASE_SETTINGS.items())
        with (data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write("\n# runq tests (tests/pgcluster.py)\n" + settings)
        (data / "pg_hba.conf").write_text(HBA, encoding="utf-8")
        return workspace


TEMPLATE = _Template()


def _quote(value: object) -> str:
    text = str(value)
    return "'" + text.replace("'", "''") + "'"


# -- one cluster -------------------------------------------------------------------------------


@dataclass
class PgCluster:
    """One PostgreSQL server of a test: its directory, address and lifecycle."""

    name: str
    workspace: Path
    host: str
    port: int
    #: False once a test gave a port it chose itself (a start never moves it then).
    port_chosen: bool = True
    #: Every cluster of the test (the factory's list): a standby joins it for teardown.
    registry: list[PgCluster] = field(default_factory=list, repr=False)
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def data(self) -> Path:
        return self.workspace / self.name

    @property
    def log_path(self) -> Path:
        return self.workspace / f"{self.name}.log"

    @property
    def socket_dir(self) -> Path:
        """Its own: two clusters may share a port on two addresses."""
        return self.workspace / f"{self.name}.sockets"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.port}/postgres"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while its pid file names a live process."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    def log(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def _bin(self, name: str) -> str:
        return str(bindir() / name)

    # -- lifecycle (blocking halves; the async methods run them in a thread) -------------------

    def _options(self) -> list[str]:
        # Per node, on the command line, so a copied directory (a standby, a rewound
        # primary) never carries another node's address.
        return [
            *("-p", str(self.port), "-c", f"listen_addresses={self.host}"),
            *("-c", f"unix_socket_directories={self.socket_dir}"),
            *("-c", f"cluster_name={self.name}"),
        ]

    def _pg_ctl(self, action: str, *args: str, timeout: float = 120) -> str:
        cmd = [self._bin("pg_ctl"), action, "-D", str(self.data), *args]
        return _run(cmd, cwd=self.workspace, timeout=timeout)

    def _start(self) -> None:
        for attempt in range(3):
            try:
                self._spawn()
                return
            except RuntimeError:
                # Another process took the free port between the probe and the bind.
                if not self.port_chosen or "already in use" not in self.log() or attempt == 2:
                    raise
                self.port = free_port(self.host)

    def _spawn(self) -> None:
        """``postgres`` as a child of this process (through runuser), not daemonised by
        pg_ctl: whoever started it reaps it, so a SIGKILLed postmaster leaves no zombie
        whose pid would make the next start believe it still runs."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        if not self.socket_dir.exists():
            self.socket_dir.mkdir()
            _give_to_postgres(self.socket_dir)
        cmd = [self._bin("postgres"), "-D", str(self.data), *self._options()]
        with self.log_path.open("ab") as log:
            process = subprocess.Popen(
                _as_postgres(cmd),
                cwd=self.workspace,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C of the test run is not the server's
            )
        self._process = process
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start:\n{self.log()[-2000:]}")
            if self._status(process) in ("ready", "standby"):
                return
            time.sleep(0.02)
        raise RuntimeError(f"{self.name} not ready in {START_SECONDS}s:\n{self.log()[-2000:]}")

    def _status(self, process: subprocess.Popen[bytes]) -> str:
        """The status line of ``postmaster.pid`` when that file is this start's."""
        try:
            lines = (self.data / "postmaster.pid").read_text().splitlines()
            pid = int(lines[0])
        except (OSError, ValueError, IndexError):
            return ""
        if process.pid not in (pid, _parent_of(pid)) or len(lines) < 8:
            return ""  # a file a crashed server left behind
        return lines[7].strip()

    def _stop(self, mode: str) -> None:
        if mode not in STOP_MODES:
            raise ValueError(f"stop mode {mode!r}: one of {STOP_MODES}")
        pid = self.pid
        if pid is None:
            return
        os.kill(pid, STOP_SIGNALS[mode])
        if _wait_gone([pid], 60):
            raise RuntimeError(f"{self.name} did not stop ({mode}) within 60 s")
        self._reap()
        _exterminate(self.data)  # what an immediate stop left working (rare, but possible)

    def _reap(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)

    def _kill(self) -> None:
        pid = self.pid
        if pid is None:
            raise RuntimeError(f"{self.name} is not running")
        os.kill(pid, signal.SIGKILL)
        # The server processes notice the postmaster's death and exit on their own (an
        # idle backend at once, a busy one at its next wait); the next start needs them
        # gone, so stragglers after a few seconds are killed too.
        left = _wait_gone(processes_in(self.data), 10)
        _kill_all(left)
        self._reap()
        _exterminate(self.data)

    def _copy_template(self) -> None:
        _run(["cp", "-a", str(TEMPLATE.data), str(self.data)], cwd=self.workspace)

    def _write_settings(self, settings: dict[str, Any]) -> None:
        if not settings:
            return
        lines = "".join(f"{key} = {_quote(value)}\n" for key, value in settings.items())
        with (self.data / "postgresql.auto.conf").open("a", encoding="utf-8") as conf:
            conf.write(lines)

    def _basebackup_from(self, source: PgCluster) -> None:
        source_dsn = f"host={source.host} port={source.port} user=postgres"
        cmd = [self._bin("pg_basebackup"), "-d", source_dsn, "-D", str(self.data)]
        _run([*cmd, "-R", "-X", "stream", "-c", "fast"], cwd=self.workspace)

    def _rewind_to(self, source: PgCluster) -> None:
        source_dsn = f"host={source.host} port={source.port} user=postgres dbname=postgres"
        cmd = [self._bin("pg_rewind"), "--target-pgdata", str(self.data)]
        _run([*cmd, "--source-server", source_dsn, "--write-recovery-conf"], cwd=self.workspace)

    def _promote(self) -> None:
        self._pg_ctl("promote", "-w")

    def destroy(self) -> None:
        """Stopped at once (immediate), every process in its directory killed; the
        directory stays until the factory removes the workspace."""
        with contextlib.suppress(Exception):
            self._stop("immediate")
        _exterminate(self.data)
        self._reap()

    # -- the async API -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start (crash recovery first if it was killed) and wait until ready."""
        await anyio.to_thread.run_sync(self._start)
        await self.wait_ready()

    async def stop(self, mode: str = "fast") -> None:
        await anyio.to_thread.run_sync(self._stop, mode)

    async def restart(self, mode: str = "fast") -> None:
        await self.stop(mode)
        await self.start()

    async def kill(self) -> None:
        """SIGKILL the postmaster (a crash: no checkpoint, no goodbye to clients)."""
        await anyio.to_thread.run_sync(self._kill)

    async def wait_ready(self, timeout: float = 60) -> None:  # noqa: ASYNC109
        async def ready() -> bool:
            try:
                await self.fetchval("SELECT 1", timeout=2)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                return False
            return True

        await wait_for(ready, timeout=timeout, interval=0.05, message=f"{self.name} ready")

    async def in_recovery(self) -> bool:
        return bool(await self.fetchval("SELECT pg_is_in_recovery()"))

    async def promote(self) -> None:
        """``pg_ctl promote``: returns once this server accepts writes."""
        await anyio.to_thread.run_sync(self._promote)
        await wait_for(
            lambda: self._accepts_writes(),
            timeout=60,
            interval=0.05,
            message=f"{self.name} promoted",
        )

    async def _accepts_writes(self) -> bool:
        try:
            return not await self.in_recovery()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return False

    # -- SQL -----------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def connect(self, timeout: float = 10) -> AsyncIterator[asyncpg.Connection]:  # noqa: ASYNC109
        conn = await asyncpg.connect(self.url, timeout=timeout)
        try:
            yield conn
        finally:
            await conn.close(timeout=timeout)

    async def execute(self, sql: str, *args: Any) -> str:
        async with self.connect() as conn:
            return str(await conn.execute(sql, *args))

    async def fetchval(self, sql: str, *args: Any, timeout: float = 10) -> Any:  # noqa: ASYNC109
        async with self.connect(timeout) as conn:
            return await conn.fetchval(sql, *args, timeout=timeout)

    async def fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        async with self.connect() as conn:
            return list(await conn.fetch(sql, *args))

    async def configure(self, **settings: Any) -> None:
        """``ALTER SYSTEM SET`` each setting, then reload (settings that need a restart
        take effect at the next ``restart``)."""
        async with self.connect() as conn:
            for key, value in settings.items():
                await conn.execute(f"ALTER SYSTEM SET {key} = {_quote(value)}")
            await conn.execute("SELECT pg_reload_conf()")

    # -- replication ---------------------------------------------------------------------------

    async def add_standby(
        self,
        name: str = "",
        *,
        host: str | None = None,
        port: int | None = None,
        settings: dict[str, Any] | None = None,
        wait: bool = True,
    ) -> PgCluster:
        """A streaming standby of this server: ``pg_basebackup -R -X stream``, started."""
        standby = PgCluster(
            name=name or f"standby_{secrets.token_hex(2)}",
            workspace=self.workspace,
            host=host or self.host,
            port=port or free_port(host or self.host),
            port_chosen=port is None,
            registry=self.registry,
        )
        self.registry.append(standby)
        await anyio.to_thread.run_sync(standby._basebackup_from, self)
        standby._write_settings(settings or {})
        await standby.start()
        if wait:
            await self.wait_streaming(standby)
        return standby

    async def replication(self) -> list[dict[str, Any]]:
        """``pg_stat_replication`` of this server, one dict per standby."""
        rows = await self.fetch(
            "SELECT application_name, state, sync_state, replay_lsn::text AS replay_lsn"
            " FROM pg_stat_replication"
        )
        return [dict(r) for r in rows]

    async def wait_streaming(
        self,
        standby: PgCluster,
        *,
        sync: bool | None = None,
        timeout: float = 60,  # noqa: ASYNC109
    ) -> None:
        """Until ``standby`` streams from this server (and, with ``sync``, is or is not
        its synchronous standby)."""

        async def streaming() -> bool:
            for row in await self.replication():
                if row["application_name"] == standby.name and row["state"] == "streaming":
                    return sync is None or (row["sync_state"] in ("sync", "quorum")) == sync
            return False

        await wait_for(streaming, timeout=timeout, interval=0.1, message=f"{standby.name} streams")

    async def wait_caught_up(self, standby: PgCluster, timeout: float = 60) -> None:  # noqa: ASYNC109
        """Until ``standby`` has replayed everything this server wrote so far."""
        target = await self.fetchval("SELECT pg_current_wal_lsn()::text")

        async def replayed() -> bool:
            return bool(
                await standby.fetchval(
                    "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn", target
                )
            )

        await wait_for(replayed, timeout=timeout, interval=0.05, message=f"{standby.name} replays")

    async def set_synchronous(self, *standbys: PgCluster, commit: str = "on") -> None:
        """Commits wait for a standby (``synchronous_standby_names``: the standbys'
        names, or any standby without names) with ``synchronous_commit = commit``."""
        names = ", ".join(s.name for s in standbys) or "*"
        await self.configure(synchronous_standby_names=names, synchronous_commit=commit)

    async def set_asynchronous(self) -> None:
        await self.configure(synchronous_standby_names="")

    async def rejoin(self, new_primary: PgCluster, *, method: str = "rewind") -> None:
        """Turn this (old, failed) primary into a standby of ``new_primary`` and start it:
        ``pg_rewind --write-recovery-conf`` (``"rewind"``: only the blocks that diverged
        are copied) or a fresh ``pg_basebackup -R`` (``"basebackup"``)."""
        if method not in ("rewind", "basebackup"):
            raise ValueError(f"rejoin method {method!r}: 'rewind' or 'basebackup'")
        if self.running:
            await self.stop("fast")
        if method == "rewind":
            # A promoted server records its new timeline in its control file only at its
            # next checkpoint; before it, pg_rewind sees one timeline and rewinds nothing.
            await new_primary.execute("CHECKPOINT")
            await anyio.to_thread.run_sync(self._rewind_to, new_primary)
        else:
            await anyio.to_thread.run_sync(shutil.rmtree, self.data)
            await anyio.to_thread.run_sync(self._basebackup_from, new_primary)
        await self.start()
        await new_primary.wait_streaming(self)


def multi_host_url(
    *clusters: PgCluster, database: str = "postgres", target_session_attrs: str = "read-write"
) -> str:
    """``postgresql://postgres@h1:p1,h2:p2/db?target_session_attrs=...`` over ``clusters``."""
    hosts = ",".join(c.address for c in clusters)
    query = f"?target_session_attrs={target_session_attrs}" if target_session_attrs else ""
    return f"postgresql://postgres@{hosts}/{database}{query}"


# -- the factory and its fixture ---------------------------------------------------------------


class PgClusterFactory:
    """Builds a test's clusters in one workspace; ``close()`` leaves nothing running."""

    def __init__(self) -> None:
        self.workspace = _new_workspace()
        self.clusters: list[PgCluster] = []

    async def start(
        self,
        name: str = "",
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        settings: dict[str, Any] | None = None,
    ) -> PgCluster:
        """A new primary from the template, started and ready."""
        cluster = self.new(name, host=host, port=port)
        await anyio.to_thread.run_sync(cluster._copy_template)
        cluster._write_settings(settings or {})
        await cluster.start()
        return cluster

    def new(self, name: str = "", *, host: str = "127.0.0.1", port: int | None = None) -> PgCluster:
        """A cluster object with no directory yet (``start`` makes one from the template)."""
        cluster = PgCluster(
            name=name or f"node_{len(self.clusters)}_{secrets.token_hex(2)}",
            workspace=self.workspace,
            host=host,
            port=port or free_port(host),
            port_chosen=port is None,
            registry=self.clusters,
        )
        self.clusters.append(cluster)
        return cluster

    def report(self) -> str:
        return "\n".join(
            f"--- PostgreSQL {c.name} ({c.address}) ---\n{c.log()[-4000:]}" for c in self.clusters
        )

    def close(self) -> None:
        for cluster in self.clusters:
            cluster.destroy()
        _remove_workspace(self.workspace)


def _skip_or_fail(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: private PostgreSQL clusters must run)")
    pytest.skip(reason)


def require_private_clusters() -> None:
    """Skip (fail under CI) where this machine cannot run a private cluster."""
    try:
        binaries = bindir()
    except ClusterUnavailable as e:
        _skip_or_fail(str(e))
        return
    missing = [b for b in ("initdb", "pg_ctl", "postgres") if not (binaries / b).exists()]
    if missing:
        _skip_or_fail(f"no {', '.join(missing)} in {binaries}")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        _skip_or_fail("running as root without runuser: cannot run PostgreSQL as postgres")


@pytest.fixture
async def pg_clusters() -> AsyncIterator[PgClusterFactory]:
    """Private PostgreSQL clusters for one test, all torn down afterwards; their logs are
    printed (pytest shows them only when the test failed)."""
    require_private_clusters()
    factory = PgClusterFactory()
    try:
        yield factory
    finally:
        report = factory.report()
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(factory.close)
        print(report)
