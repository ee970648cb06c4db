"""How many of the heartbeat's row updates are HOT (not in CI).

    .venv/bin/python bench/hot_heartbeat.py --runs 160 --beats 50

In a scratch database: submits ``--runs`` runs, claims them all, then renews every lease
``--beats`` times with ``heartbeat_many`` (the worker's heartbeat), and reports the run
table's ``n_tup_upd`` / ``n_tup_hot_upd`` over the heartbeats alone, and the size of
``runs_lease_idx`` before and after them. A heartbeat changes only ``locked_at``: it can
be HOT (no index entry written) only when no index of the run table has that column.
Prints one ``RESULT {...}`` line; the database is dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from fleet_sim import drop_database, dsn_for, fresh_database

from runq.model import NewRun
from runq.seal import PlainSealer
from runq.store.postgres.store import PostgresStore

STATS = (
    "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
    " WHERE schemaname = 'runq' AND relname = 'runs'"
)
LEASE_IDX_SIZE = "SELECT pg_relation_size('runq.runs_lease_idx')"


async def table_stats(con: asyncpg.Connection) -> tuple[int, int]:
    # An idle backend flushes its counters within PGSTAT_IDLE_INTERVAL (10 s): wait that.
    await asyncio.sleep(11)
    await con.execute("SELECT pg_stat_clear_snapshot()")
    row = await con.fetchrow(STATS)
    return int(row["n_tup_upd"]), int(row["n_tup_hot_upd"])


async def run(args: argparse.Namespace) -> dict[str, Any]:
    await fresh_database(args.dsn, args.db, log_statements=False)
    url = dsn_for(args.dsn, args.db)
    store = PostgresStore(url, schema="runq", sealer=PlainSealer())
    con = await asyncpg.connect(url)
    try:
        await store.connect()
        await store.migrate()
        news = [
            NewRun(component_type="task", component_id="noop", payload=None)
            for _ in range(args.runs)
        ]
        await store.submit_many(news)
        claimed = []
        while len(claimed) < args.runs:
            claimed += await store.claim("w1", 16, deployment_id=None)
        leases = [r.lease for r in claimed]
        upd0, hot0 = await table_stats(con)
        size0 = await con.fetchval(LEASE_IDX_SIZE)
        t0 = time.perf_counter()
        for _ in range(args.beats):
            result = await store.heartbeat_many("w1", leases)
            assert len(result.renewed) == len(leases)
        elapsed = time.perf_counter() - t0
        upd1, hot1 = await table_stats(con)
        size1 = await con.fetchval(LEASE_IDX_SIZE)
    finally:
        await con.close()
        await store.close()
        await drop_database(args.dsn, args.db)
    updates = upd1 - upd0
    return {
        "runs": args.runs,
        "beats": args.beats,
        "updates": updates,
        "hot_updates": hot1 - hot0,
        "hot_share": round((hot1 - hot0) / updates, 3) if updates else None,
        "lease_idx_bytes_before_after": [size0, size1],
        "ms_per_heartbeat": round(elapsed / args.beats * 1000, 2),
        "load": os.getloadavg(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test", help="admin")
    p.add_argument("--db", default="bench_hot")
    p.add_argument("--runs", type=int, default=160)
    p.add_argument("--beats", type=int, default=50)
    common.emit(asyncio.run(run(p.parse_args())))


if __name__ == "__main__":
    main()
