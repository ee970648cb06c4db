"""SQLite faults: SIGKILL of ``runq serve`` under load, and a full disk.

* SIGKILL during heavy submit and drain load (eight HTTP clients submitting as fast as the
  daemon answers while it executes): after each kill the database file passes
  ``PRAGMA integrity_check``, the daemon restarts on it, every acknowledged submission is
  present, the reaper settles what was running (a ``max_attempts = 1`` run that was
  running is failed, never executed twice), and no run executed more than its
  ``max_attempts``.
* A full disk (a small tmpfs; skipped with the reason where the machine refuses the
  mount): submissions fail with a clear 503 naming the full disk, the daemon stays up,
  nothing acknowledged is lost, runs that finished meanwhile still settle, and the daemon
  recovers by itself once space returns.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from helpers import wait_for
from serve_handlers import read_executions
from serve_harness import RunqSetup, ServeFactory

from reliability.clients import LoadStats, run_clients

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

LOCK_GRACE = 3.0
QUEUE = {
    "poll_interval": 0.2,
    "lock_grace_seconds": LOCK_GRACE,
    "stop_timeout_seconds": 1,
    "max_concurrency": 16,
    "max_queue_depth": 0,
    "retry_delay_seconds": 0.2,
}
ROUTING = {"*": "local"}


def integrity(db: Path) -> list[str]:
    conn = sqlite3.connect(db, timeout=30)
    try:
        return [row[0] for row in conn.execute("PRAGMA integrity_check").fetchall()]
    finally:
        conn.close()


def rows(db: Path, table: str = "runq_runs") -> dict[str, sqlite3.Row]:
    conn = sqlite3.connect(db, timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        return {r["id"]: r for r in conn.execute(f"SELECT * FROM {table}")}
    finally:
        conn.close()


def unfinished(db: Path) -> int:
    conn = sqlite3.connect(db, timeout=30)
    try:
        value: int = conn.execute(
            "SELECT count(*) FROM runq_runs WHERE status NOT IN ('completed','failed','cancelled')"
        ).fetchone()[0]
        return value
    finally:
        conn.close()


async def wait_all_final(db: Path, timeout: float) -> None:  # noqa: ASYNC109
    async def none_left() -> bool:
        return await anyio.to_thread.run_sync(unfinished, db) == 0

    await wait_for(none_left, timeout=timeout, interval=0.25, message="every run final")


def acked_at_least(stats: LoadStats, target: int) -> Callable[[], bool]:
    return lambda: len(stats.acked) >= target


# -- SIGKILL under load ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kills", [pytest.param(3, id="short"), pytest.param(25, id="long", marks=pytest.mark.long)]
)
async def test_sigkill_under_submit_and_drain_load_loses_nothing_and_leaves_a_sound_file(
    kills: int,
    sqlite_setup: RunqSetup,
    sqlite_serve_factory: ServeFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = await sqlite_serve_factory({"queue": QUEUE, "routing": ROUTING})
    db = sqlite_setup.workdir / "runq.db"
    stats = LoadStats()
    stop = anyio.Event()
    checks: list[list[str]] = []
    running_at_kill: list[int] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: run_clients(lambda: server.url, stats, stop, clients=8))
        for _ in range(kills):
            await wait_for(
                acked_at_least(stats, len(stats.acked) + 150),
                timeout=60,
                message="submissions flow",
            )
            server.kill()
            # The file as the crash left it (WAL and all), before anything recovers it.
            checks.append(await anyio.to_thread.run_sync(integrity, db))
            table = await anyio.to_thread.run_sync(rows, db)
            running_at_kill.append(sum(1 for r in table.values() if r["status"] == "running"))
            await server.start()
        await wait_for(
            acked_at_least(stats, len(stats.acked) + 150),
            timeout=60,
            message="submissions flow again",
        )
        stop.set()

    assert all(check == ["ok"] for check in checks), checks
    assert stats.server_errors() == 0, stats.bodies[:5]
    assert set(stats.statuses) == {"202"}, (stats.statuses, stats.bodies[:5])
    # The reaper settles what was running at each kill: nothing stays running.
    await wait_all_final(db, timeout=LOCK_GRACE + 30)
    table = await anyio.to_thread.run_sync(rows, db)
    missing = [run_id for run_id in stats.acked if run_id not in table]
    assert not missing, f"acknowledged and lost: {missing[:5]}"
    assert await anyio.to_thread.run_sync(integrity, db) == ["ok"]

    per_run: dict[str, list[int]] = defaultdict(list)
    for run_id, attempt, _pid in read_executions(sqlite_setup.workdir):
        per_run[run_id].append(attempt)
    for run_id, attempts in per_run.items():
        row = table[run_id]
        assert len(attempts) == len(set(attempts)), f"{run_id}: an attempt ran twice"
        assert len(attempts) <= row["max_attempts"], (run_id, attempts, row["max_attempts"])
        assert row["attempt"] <= row["max_attempts"]
    outcomes = Counter(
        f"{r['status']}/{r['termination_reason']}"
        for r in table.values()
        if r["attempt"] > 1 or r["termination_reason"] == "retries_exhausted"
    )
    with capsys.disabled():
        print(
            f"\nsqlite SIGKILL x{kills}: {len(stats.acked)} acknowledged, {len(table)} rows, "
            f"integrity_check {checks[0]} after every kill, running at each kill "
            f"{running_at_kill}, settled by the reaper: {dict(outcomes)}, transport errors "
            f"while down {dict(stats.errors)}"
        )


# -- a full disk -----------------------------------------------------------------------------------


def stale_leases(db: Path, run_ids: list[str]) -> bool:
    """True when every run of ``run_ids`` is running with a lease older than the grace
    (by the database clock)."""
    conn = sqlite3.connect(db, timeout=30)
    try:
        marks = ",".join("?" * len(run_ids))
        (n,) = conn.execute(
            f"SELECT count(*) FROM runq_runs WHERE id IN ({marks}) AND status = 'running'"
            " AND locked_at < (julianday('now') - 2440587.5) * 86400.0 - ?",
            (*run_ids, LOCK_GRACE),
        ).fetchone()
    finally:
        conn.close()
    return bool(n == len(run_ids))


def sqlite_setup_dir(server: Any) -> Path:
    return Path(server.setup.workdir)


def mount_small_tmpfs(where: Path, size: str) -> None:
    where.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill: {result.stderr.strip() or 'refused'}")


def unmount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30, check=False)


def fill(path: Path) -> int:
    """Write until the file system is full; returns the bytes written."""
    chunk = b"\0" * 65536
    written = 0
    with path.open("wb", buffering=0) as f:
        while True:
            try:
                written += f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
        for size in (4096, 512, 1):  # the last few blocks too
            while True:
                try:
                    written += f.write(b"\0" * size)
                except OSError:
                    break
    return written


async def test_a_full_disk_answers_503_loses_nothing_and_recovers(
    sqlite_setup: RunqSetup,
    sqlite_serve_factory: ServeFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    disk = sqlite_setup.workdir / "disk"
    mount_small_tmpfs(disk, "4m")
    server = None
    try:
        server = await sqlite_serve_factory(
            {
                "store": {"url": f"sqlite:///{disk / 'runq.db'}"},
                "queue": QUEUE,
                "routing": ROUTING,
            }
        )
        await full_disk_scenario(server, disk, capsys)
    finally:
        if server is not None:
            await server.terminate()
        unmount(disk)


async def full_disk_scenario(server: Any, disk: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = disk / "runq.db"
    acked: list[str] = []
    async with httpx.AsyncClient(base_url=server.url, timeout=30.0) as client:

        async def submit(payload: Any, component: str = "task/echo") -> httpx.Response:
            ctype, cid = component.split("/")
            response = await client.post(
                "/runs", json={"component_type": ctype, "component_id": cid, "payload": payload}
            )
            if response.status_code == 202:
                acked.append(response.json()["run_id"])
            return response

        # Runs that will finish while the disk is full: their completions must still land.
        for i in range(4):
            assert (await submit({"seconds": 2.5, "i": i}, "task/record")).status_code == 202
        in_flight = list(acked)

        async def all_running() -> bool:
            statuses = [(await client.get(f"/runs/{r}")).json()["status"] for r in in_flight]
            return all(s == "running" for s in statuses)

        await wait_for(all_running, timeout=15, message="the slow runs are running")

        ballast = disk / "ballast"
        filled = await anyio.to_thread.run_sync(fill, ballast)
        big = {"blob": "x" * 32_000}
        refusals: list[httpx.Response] = []
        accepted_while_full = 0
        for _ in range(200):  # a WAL may take a few more pages before it must grow
            response = await submit(big)
            if response.status_code == 503:
                refusals.append(response)
                if len(refusals) >= 5:
                    break
            else:
                assert response.status_code == 202, response.text
                accepted_while_full += 1
        assert len(refusals) >= 5, "a full disk never refused a submission"
        body = refusals[0].json()
        assert body["error"] == "store_unavailable", body
        assert "full" in body["detail"], body["detail"]
        assert refusals[0].headers.get("Retry-After")
        assert (await client.get("/healthz")).status_code == 200
        assert server.returncode is None

        async def completion_refused() -> bool:
            text = (await client.get("/metrics")).text
            return 'runq_store_errors_total{service="executor"}' in text

        # The slow runs finish while the disk is full: their completion writes are refused,
        # and their leases go stale (no heartbeat can be written either).
        await wait_for(completion_refused, timeout=15, message="a completion meets the full disk")
        await wait_for(
            lambda: anyio.to_thread.run_sync(stale_leases, db, in_flight),
            timeout=15,
            message="the slow runs' leases are stale",
        )

        async def reaper_refused() -> bool:
            text = (await client.get("/metrics")).text
            return 'runq_store_errors_total{service="reaper"}' in text

        # The reaper found them stale and could not write either: it will wait a grace
        # once the disk has room, so the finished runs' own completions land first.
        await wait_for(reaper_refused, timeout=15, message="the reaper meets the full disk")

        # Space returns: the daemon recovers without a restart.
        ballast.unlink()
        freed_at = time.monotonic()

        async def accepted() -> bool:
            return (await submit({"after": True})).status_code == 202

        await wait_for(accepted, timeout=30, message="submissions are accepted again")
        recovered_in = time.monotonic() - freed_at
        assert (await client.get("/readyz")).status_code == 200

    await wait_all_final(db, timeout=LOCK_GRACE + 30)
    table = await anyio.to_thread.run_sync(rows, db)
    missing = [run_id for run_id in acked if run_id not in table]
    assert not missing, f"acknowledged and lost: {missing[:5]}"
    assert await anyio.to_thread.run_sync(integrity, db) == ["ok"]
    slow = Counter(f"{table[r]['status']}/attempt {table[r]['attempt']}" for r in in_flight)
    # They finished during the outage: their completions are kept, not reaped into a
    # dead letter (max_attempts 1) once the disk has room again.
    assert slow == {"completed/attempt 1": len(in_flight)}, slow
    executed = Counter(r for r, _, _ in read_executions(sqlite_setup_dir(server)))
    assert all(executed[r] == 1 for r in in_flight), executed
    assert server.returncode is None
    assert "Traceback" not in server.logs()
    with capsys.disabled():
        print(
            f"\nsqlite full disk: ballast {filled} bytes; {accepted_while_full} accepted into "
            f"the WAL's free pages, then 503: {body['detail'][:120]!r}; accepted again "
            f"{recovered_in:.1f}s after space returned; {len(acked)} acknowledged, none lost; "
            f"runs in flight meanwhile: {dict(slow)}"
        )
