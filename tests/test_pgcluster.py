"""The private-cluster helper (tests/pgcluster.py) does what the fault tests rely on: real
durability through a crash, streaming standbys, synchronous commits that wait for one,
promotion, an old primary rejoining, and a teardown that leaves no server process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import asyncpg
import pytest
from pgcluster import (
    PgCluster,
    PgClusterFactory,
    multi_host_url,
    processes_in,
    sweep_abandoned,
)

pytestmark = pytest.mark.anyio


async def _count(cluster: PgCluster) -> int:
    return int(await cluster.fetchval("SELECT count(*) FROM t"))


async def test_committed_rows_survive_an_immediate_stop_and_a_sigkill(
    pg_clusters: PgClusterFactory,
) -> None:
    primary = await pg_clusters.start(settings={"autovacuum": "off"})
    assert await primary.fetchval("SHOW autovacuum") == "off"
    assert await primary.fetchval("SHOW fsync") == "on"
    await primary.execute("CREATE TABLE t (i int)")
    await primary.execute("INSERT INTO t SELECT generate_series(1, 100)")

    await primary.stop("immediate")
    assert not primary.running
    await primary.start()
    assert await _count(primary) == 100

    await primary.execute("INSERT INTO t VALUES (101)")
    pid = primary.pid
    assert pid is not None
    await primary.kill()
    assert not primary.running
    assert processes_in(primary.data) == [], "a server process outlived the kill"
    await primary.start()  # crash recovery on the same directory
    assert await _count(primary) == 101
    assert "database system was interrupted" in primary.log()

    await primary.restart("fast")
    assert await _count(primary) == 101


async def test_a_standby_streams_waits_synchronously_is_promoted_and_the_old_primary_rejoins(
    pg_clusters: PgClusterFactory,
) -> None:
    primary = await pg_clusters.start("node_a")
    await primary.execute("CREATE TABLE t (i int)")
    standby = await primary.add_standby("node_b")
    assert await standby.in_recovery()

    # Asynchronous by default; synchronous once named.
    assert [r["sync_state"] for r in await primary.replication()] == ["async"]
    await primary.set_synchronous(standby)
    await primary.wait_streaming(standby, sync=True)
    await primary.execute("INSERT INTO t VALUES (1)")
    # A synchronous commit (remote flush) is on the standby once acknowledged; replay
    # follows at once.
    await primary.wait_caught_up(standby)
    assert await _count(standby) == 1

    # With the standby gone a synchronous commit waits: it is never acknowledged alone.
    await standby.stop("fast")
    async with primary.connect() as conn:
        with anyio.move_on_after(1) as waited:
            await conn.execute("INSERT INTO t VALUES (2)")
        assert waited.cancelled_caught, "a synchronous commit returned without its standby"
    await standby.start()
    await primary.wait_streaming(standby, sync=True)

    # Failover: the primary dies, the standby is promoted and takes writes.
    url = multi_host_url(primary, standby)
    await primary.kill()
    await standby.promote()
    assert not await standby.in_recovery()
    conn = await asyncpg.connect(url)
    try:
        assert await conn.fetchval("SELECT inet_server_port()") == standby.port
        await conn.execute("INSERT INTO t VALUES (3)")
    finally:
        await conn.close()

    # The old primary comes back as a standby of the new one (pg_rewind).
    await standby.set_asynchronous()
    await primary.rejoin(standby)
    assert await primary.in_recovery()
    await standby.wait_caught_up(primary)
    assert await _count(primary) == await _count(standby)


async def test_rejoin_by_a_fresh_basebackup(pg_clusters: PgClusterFactory) -> None:
    primary = await pg_clusters.start()
    standby = await primary.add_standby()
    await primary.stop("immediate")
    await standby.promote()
    await standby.execute("CREATE TABLE t (i int)")
    await primary.rejoin(standby, method="basebackup")
    await standby.wait_caught_up(primary)
    assert await _count(primary) == 0


async def test_teardown_kills_every_server_even_one_left_running() -> None:
    factory = PgClusterFactory()
    primary = await factory.start()
    standby = await primary.add_standby()
    pids = [p for c in (primary, standby) for p in processes_in(c.data)]
    assert len(pids) > 4
    await anyio.to_thread.run_sync(factory.close)
    assert all(not _alive_pid(p) for p in pids)
    assert not factory.workspace.exists()


def _alive_pid(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


ORPHAN_SCRIPT = """
import sys, time, anyio
from pgcluster import PgClusterFactory
async def main():
    factory = PgClusterFactory()
    cluster = await factory.start()
    print(factory.workspace, cluster.pid, flush=True)
    time.sleep(600)
anyio.run(main)
"""


async def test_clusters_of_a_killed_test_process_are_swept_by_the_next() -> None:
    tests_dir = Path(__file__).resolve().parent
    child = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_SCRIPT],
        cwd=tests_dir,
        env={**os.environ, "PYTHONPATH": str(tests_dir)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = await anyio.to_thread.run_sync(child.stdout.readline)
    finally:
        child.kill()  # the test process dies without any teardown
        child.wait()
    workspace, pid = Path(line.split()[0]), int(line.split()[1])
    assert _alive_pid(pid), "the orphaned postmaster should still run before the sweep"
    removed = await anyio.to_thread.run_sync(sweep_abandoned)
    assert workspace in removed
    assert not workspace.exists()
    assert not _alive_pid(pid)
