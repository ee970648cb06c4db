"""The console's grouped reads, on both engines: final runs per minute over a window and
running runs per worker, each answered from an index rather than a scan of the runs."""

from __future__ import annotations

import sqlite3
from typing import Any

import asyncpg
import pytest
from conftest import PG_URL
from factories import make_run

from runq.model import Status
from runq.store.base import Store

pytestmark = pytest.mark.anyio

HOUR = 3600.0


async def test_final_runs_are_counted_per_minute_and_status_within_the_window(
    store: Store,
) -> None:
    for _ in range(3):
        await make_run(store, Status.COMPLETED, finished_ago=30)
    await make_run(store, Status.FAILED, finished_ago=30)
    await make_run(store, Status.FAILED, finished_ago=600)
    await make_run(store, Status.CANCELLED, finished_ago=30)
    await make_run(store, Status.COMPLETED, finished_ago=2 * HOUR)  # outside the window
    await make_run(store, Status.QUEUED)
    await make_run(store, Status.RUNNING)

    now, rows = await store.finished_per_minute(window_seconds=HOUR)

    assert abs(now - await store.now()) < 5
    totals: dict[str, int] = {}
    for minute, status, n in rows:
        assert minute % 60 == 0, "buckets start on a whole minute"
        assert now - HOUR - 60 <= minute <= now
        totals[status] = totals.get(status, 0) + n
    assert totals == {"completed": 3, "failed": 2, "cancelled": 1}
    failed_minutes = sorted(m for m, s, _ in rows if s == "failed")
    assert len(failed_minutes) == 2
    assert failed_minutes[1] - failed_minutes[0] >= 9 * 60


async def test_nothing_finished_still_gives_the_clock(store: Store) -> None:
    await make_run(store, Status.QUEUED)
    now, rows = await store.finished_per_minute(window_seconds=HOUR)
    assert rows == []
    assert abs(now - await store.now()) < 5


async def test_running_runs_are_counted_per_worker(store: Store) -> None:
    for _ in range(2):
        await make_run(store, Status.RUNNING, worker="w-a")
    await make_run(store, Status.RUNNING, worker="w-b")
    await make_run(store, Status.COMPLETED, worker="w-c")
    await make_run(store, Status.QUEUED)
    assert await store.running_by_worker() == {"w-a": 2, "w-b": 1}


async def _plan(store: Any, statement: str, *args: Any) -> str:
    if store.engine == "sqlite":
        with sqlite3.connect(store.path) as conn:
            found = conn.execute("EXPLAIN QUERY PLAN " + statement, *args).fetchall()
        return "\n".join(str(row[-1]) for row in found)
    con = await asyncpg.connect(PG_URL)
    try:
        # With the sequential scan priced out, the plan says whether an index can serve
        # the statement at all (a tiny test table would be scanned either way).
        await con.execute(f"SET search_path TO {store.schema}; SET enable_seqscan = off")
        return "\n".join(r[0] for r in await con.fetch("EXPLAIN " + statement, *args))
    finally:
        await con.close()


async def test_the_reads_walk_an_index_not_the_run_table(store: Any) -> None:
    await make_run(store, Status.COMPLETED)
    sql = store._console_sql
    if store.engine == "sqlite":
        per_minute = await _plan(store, sql.finished_per_minute, {"since": 0.0})
        by_worker = await _plan(store, sql.running_by_worker)
    else:
        per_minute = await _plan(store, sql.finished_per_minute, HOUR)
        by_worker = await _plan(store, sql.running_by_worker)
    assert "runs_final_idx" in per_minute, per_minute
    # Either the lease index or the status index: both hold only the running runs' entries.
    assert "Seq Scan" not in by_worker, by_worker
    assert "SCAN runq_runs\n" not in by_worker + "\n", by_worker
    assert "runs_lease_idx" in by_worker or "status=?" in by_worker, by_worker
