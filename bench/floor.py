"""The floor: what PostgreSQL allows for runq's schema and statements, with no daemon.

A minimal asyncpg loop that issues runq's OWN claim and completion statements (the texts
are imported from runq/store/postgres/statements/, never copied): claim up to 16 runs, complete
them in one statement, repeat until the queue is empty. No handler, no sealing of an
answer, no Run objects, no heartbeats, no metrics. runq's W1 drain is reported as a
fraction of this.

    python bench/floor.py --dsn DSN [--runs 20000] [--loops 1] [--slots 16]

``--loops 2 --slots 8`` runs two such loops on two connections (16 in flight in all).
``--mode fused`` (informational, not the floor) sends the completion of one batch and the
claim of the next as ONE statement (the two texts as data-modifying CTEs): one round trip
per batch instead of two, what a daemon could do when its slots free up together.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from runq.model import NewRun
from runq.seal import KeyRing, decode_key, generate_key
from runq.store.postgres import PostgresStore
from runq.store.postgres.connection import session_settings
from runq.store.postgres.statements import build as _build_sql

SCHEMA = "runq"
#: The session settings of runq's own pools (runq/store/postgres/connection.py): without
#: force_generic_plan the claim is planned again on every call and the floor reads low.
RUNQ_SESSION = session_settings("runq-floor")
#: ... and of its claim connections, whose commits do not wait for the WAL flush.
RUNQ_CLAIM_SESSION = session_settings("runq-floor claims", synchronous_commit=False)


def fused_sql(sql: Any) -> str:
    """complete ($1 worker, $2-$5) and claim ($1 worker, $2-$7) as one statement: the
    completion's parameters are renumbered to $8-$11."""
    complete = re.sub(r"\$([2-5])\b", lambda m: f"${int(m.group(1)) + 6}", sql.complete)
    return f"WITH done AS ({complete}), claimed AS ({sql.claim}) SELECT * FROM claimed"


async def fused_loop(dsn: str, worker: str, slots: int, sql: Any, counts: list[int]) -> None:
    con = await asyncpg.connect(dsn, server_settings=RUNQ_SESSION)
    fused = fused_sql(sql)
    try:
        rules = [True, [], [], [], []]
        rows = await con.fetch(sql.claim, worker, slots, *rules)
        while rows:
            rows = sorted(rows, key=lambda r: r["id"])
            k = len(rows)
            done = (
                [r["id"] for r in rows],
                [r["attempt"] for r in rows],
                [None] * k,
                ["completed"] * k,
            )
            rows = await con.fetch(fused, worker, slots, *rules, *done)
            counts.append(k)
    finally:
        await con.close()


async def loop(dsn: str, worker: str, slots: int, sql: Any, counts: list[int]) -> None:
    # Claims and completions on connections of their own, as runq's store has them.
    claims = await asyncpg.connect(dsn, server_settings=RUNQ_CLAIM_SESSION)
    con = await asyncpg.connect(dsn, server_settings=RUNQ_SESSION)
    try:
        # Same parameters as PostgresStore.claim: worker, slots, serialize_sessions, and the
        # four (empty) budget exclusion arrays.
        rules = [True, [], [], [], []]
        while True:
            rows = await claims.fetch(sql.claim, worker, slots, *rules)
            if not rows:
                return
            rows = sorted(rows, key=lambda r: r["id"])
            k = len(rows)
            await con.fetch(
                sql.complete,
                worker,
                [r["id"] for r in rows],
                [r["attempt"] for r in rows],
                [None] * k,
                ["completed"] * k,
            )
            counts.append(k)
    finally:
        await con.close()
        await claims.close()


async def main_async(args: argparse.Namespace) -> None:
    sealer = KeyRing([decode_key(generate_key(), key_name="bench")])
    store = PostgresStore(args.dsn, schema=SCHEMA, sealer=sealer)
    await store.connect()
    try:
        await store.migrate()
        for start in range(0, args.runs, common.SUBMIT_BATCH):
            k = min(common.SUBMIT_BATCH, args.runs - start)
            await store.submit_many(
                [
                    NewRun(component_type="task", component_id="noop", payload={"i": start + j})
                    for j in range(k)
                ]
            )
        since = await store.now()
    finally:
        await store.close()
    sql = _build_sql(SCHEMA, 0.0)
    counts: list[int] = []
    t0 = time.perf_counter()
    await asyncio.gather(
        *(loop(args.dsn, f"floor-{i}", args.slots, sql, counts) for i in range(args.loops))
    )
    wall = time.perf_counter() - t0
    con = await asyncpg.connect(args.dsn)
    try:
        n, first, last = await con.fetchrow(
            f"SELECT count(*), min(completed_at), max(completed_at) FROM {SCHEMA}.runs "
            "WHERE status = 'completed' AND completed_at > $1",
            since,
        )
    finally:
        await con.close()
    if n != args.runs:
        raise SystemExit(f"floor: {n} of {args.runs} runs completed")
    common.emit(
        {
            "system": "floor" if args.mode == "sequential" else f"floor_{args.mode}",
            "mode": args.mode,
            "workload": "floor",
            "runs": args.runs,
            "loops": args.loops,
            "slots": args.slots,
            "drain_rate": common.window_rate(n, first, last) or round(n / wall, 1),
            "wall_rate": round(n / wall, 1),
            "statements": (1 if args.mode == "fused" else 2) * len(counts),
        }
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dsn", required=True)
    p.add_argument("--runs", type=int, default=common.W1_RUNS)
    p.add_argument("--loops", type=int, default=1)
    p.add_argument("--slots", type=int, default=common.CONCURRENCY)
    p.add_argument("--mode", choices=["sequential", "fused"], default="sequential")
    p.add_argument("--logdir", default="/tmp")
    args = p.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
