"""EXPLAIN (ANALYZE, BUFFERS) of the operator reads on a run table of 1,000,000 final rows:
``stats`` (``GET /v1/stats``, ``runq status``), ``health`` (the Prometheus exporter's
refresh, ``runq status``), the readers of the lease index (the reaper, the console's
running runs per worker) and the operator listing (``list_jobs``: the page and its count,
as the API, the UI and ``runq jobs`` run them).

    .venv/bin/python bench/explain_stats.py > bench/STATS_EXPLAIN.md

The table holds ``--final`` final rows (completed 80 %, failed 15 %, cancelled 5 %, over
30 days, one of 1,000 users on half of them), ``--queued`` queued and ``--running`` running
rows. ``VACUUM ANALYZE`` runs after the load. Each statement is the store's own text, run
under ``EXPLAIN (ANALYZE, BUFFERS)`` in a transaction that is rolled back, twice (the
second run is the one printed: a warm cache, as a statement scraped every few seconds
sees). The scratch database is created and dropped at the end (``--keep`` keeps it).
Prints the whole markdown document.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet_sim import drop_database, dsn_for, fresh_database

from runq.listing import ALL_RUNS, RunFilter
from runq.model import Status
from runq.seal import PlainSealer
from runq.store.listings import Listing
from runq.store.postgres import statements as pg_sql
from runq.store.postgres.statements.console import build_console
from runq.store.postgres.store import PostgresStore

SCHEMA = "runq"

_FILL = """
INSERT INTO {s}.runs (id, component_type, component_id, status, attempt, max_attempts,
    priority, actor, user_id, deployment_id, origin, created_at, updated_at, available_at,
    started_at, completed_at, locked_by, locked_at, termination_reason, has_request, payload)
SELECT '{prefix}-' || lpad(g::text, 8, '0'), 'task', 'echo', {status}, 1, 1,
    0, '{{}}', CASE WHEN g % 2 = 0 THEN 'user-' || (g % 1000) END, '', 'bench',
    {t}, {t}, {t}, {started}, {completed}, {locked_by}, {locked_at}, {reason}, true,
    '\\x6e756c6c'::bytea
FROM generate_series(1, {n}) AS g
"""


def fill(kind: str, n: int, now: float) -> str:
    """``n`` rows of one kind: final (spread over 30 days), queued or running (recent)."""
    if kind == "final":
        status = (
            "CASE WHEN g % 20 = 0 THEN 'cancelled' WHEN g % 20 < 4 THEN 'failed' "
            "ELSE 'completed' END"
        )
        t = f"({now} - 30 * 86400 + g * {30 * 86400 / max(n, 1)})"
        return _FILL.format(
            s=SCHEMA,
            prefix="f",
            status=status,
            t=t,
            started=t,
            completed=f"{t} + 1",
            locked_by="NULL",
            locked_at="NULL",
            reason="CASE WHEN g % 20 = 0 THEN 'cancelled' WHEN g % 20 < 4 THEN "
            "'retries_exhausted' ELSE 'completed' END",
            n=n,
        )
    t = f"({now} - 60 + g * 0.001)"
    running = kind == "running"
    return _FILL.format(
        s=SCHEMA,
        prefix=kind[0],
        status=f"'{kind}'",
        t=t,
        started=t if running else "NULL",
        completed="NULL",
        locked_by="'w1'" if running else "NULL",
        locked_at=f"{now}" if running else "NULL",
        reason="NULL",
        n=n,
    )


async def build(con: asyncpg.Connection, final: int, queued: int, running: int) -> None:
    now = time.time()
    await con.execute(fill("final", final, now))
    await con.execute(fill("queued", queued, now))
    await con.execute(fill("running", running, now))
    await con.execute(f"VACUUM ANALYZE {SCHEMA}.runs")


async def explain(con: asyncpg.Connection, title: str, sql: str, *args: object) -> None:
    text = ""
    for _ in range(2):  # the second run, warm, is printed
        tr = con.transaction()
        await tr.start()
        try:
            rows = await con.fetch("EXPLAIN (ANALYZE, BUFFERS) " + sql, *args)
        finally:
            await tr.rollback()
        text = "\n".join(r[0] for r in rows)
    print(f"\n### {title}\n\n```sql\n{' '.join(sql.split())}\n```\n\n```\n{text}\n```")


LISTINGS: list[tuple[str, Listing]] = [
    (
        "all runs, newest first (the UI's and API's default)",
        Listing.of(ALL_RUNS, after=None, limit=20),
    ),
    ("all runs, newest first, page 500", Listing.of(ALL_RUNS, after=None, limit=20, page=500)),
    (
        "queued, newest first",
        Listing.of(RunFilter(statuses=(Status.QUEUED,)), after=None, limit=20),
    ),
    (
        "failed, newest first",
        Listing.of(RunFilter(statuses=(Status.FAILED,)), after=None, limit=20),
    ),
    (
        "running, oldest first",
        Listing.of(RunFilter(statuses=(Status.RUNNING,)), after=None, limit=20, sort_order="asc"),
    ),
    (
        "one user's runs, newest first",
        Listing.of(RunFilter(user_id="user-42"), after=None, limit=20),
    ),
    (
        "all runs by completed_at, newest first",
        Listing.of(ALL_RUNS, after=None, limit=20, sort_by="completed_at"),
    ),
]


#: Candidate rewrites (not runq's statements yet), planned on the same table so the
#: proposal in bench/README.md is measured. ``{s}`` is the schema.
PROPOSED: list[tuple[str, str]] = [
    (
        "newest first through the primary key (ids are UUIDv7, time-ordered)",
        "SELECT * FROM {s}.runs ORDER BY id DESC LIMIT 20",
    ),
    (
        "page 500 by keyset instead of OFFSET (the last id of page 499 as the bound)",
        "SELECT * FROM {s}.runs WHERE id < 'f-00990020' ORDER BY id DESC LIMIT 20",
    ),
    (
        "capped count (the listing shows 10,000+ past the cap)",
        "SELECT count(*) FROM (SELECT 1 FROM {s}.runs LIMIT 10001) AS capped",
    ),
    (
        "active statuses only, each from its partial index",
        """SELECT (SELECT count(*) FROM {s}.runs WHERE status = 'queued') AS queued,
                  (SELECT count(*) FROM {s}.runs WHERE status = 'running') AS running,
                  (SELECT count(*) FROM {s}.runs WHERE status = 'paused') AS paused""",
    ),
]


async def report(con: asyncpg.Connection, store: PostgresStore, opts: argparse.Namespace) -> None:
    sql = store.statements
    version = await con.fetchval("SHOW server_version")
    size = await con.fetchval(f"SELECT pg_size_pretty(pg_total_relation_size('{SCHEMA}.runs'))")
    print(
        f"# Operator reads on 1,000,000 final rows\n\nGenerated by `bench/explain_stats.py` "
        f"(PostgreSQL {version}): {opts.final:,} final rows (80 % completed, 15 % failed, "
        f"5 % cancelled, over 30 days), {opts.queued:,} queued, {opts.running:,} running; "
        f"the run table with its indexes is {size}. Plans of the second of two runs (warm). "
        "Which full scans remain and what to change: bench/README.md, section 4 of "
        '"At scale".'
    )
    print("\n## stats\n")
    await explain(con, "stats", sql.stats)
    print("\n## health\n")
    await explain(con, "health (lock grace 60 s, worker max age 60 s)", sql.health, 60.0, 60.0)
    print("\n## Readers of runs_lease_idx (keyed on locked_by since migration 0011)\n")
    # The reaper runs every poll interval on every replica; with no stale lease (the
    # usual case) it reads every running entry and keeps none.
    await explain(
        con, "reaper, nothing stale (grace 60 s, limit 100)", sql.reap, 60.0, 100, "a", "b"
    )
    await explain(
        con, "reaper, every lease stale (grace -1 s, limit 100)", sql.reap, -1.0, 100, "a", "b"
    )
    await explain(
        con, "console: running runs per worker", build_console(SCHEMA, 0.0).running_by_worker
    )
    print("\n## list_jobs (page of 20 and its count)\n")
    for title, listing in LISTINGS:
        page, page_args = listing.page_statement(pg_sql.LISTING, SCHEMA)
        count, count_args = listing.count_statement(pg_sql.LISTING, SCHEMA)
        await explain(con, f"{title}: page", page, *page_args)
        await explain(con, f"{title}: count", count, *count_args)
    print("\n## Candidate rewrites (not in runq yet)\n")
    for title, text in PROPOSED:
        await explain(con, title, text.format(s=SCHEMA))


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--db", default="bench_stats")
    parser.add_argument("--final", type=int, default=1_000_000)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--running", type=int, default=160)
    parser.add_argument("--keep", action="store_true")
    opts = parser.parse_args()
    await fresh_database(opts.dsn, opts.db, log_statements=False)
    url = dsn_for(opts.dsn, opts.db)
    store = PostgresStore(url, schema=SCHEMA, sealer=PlainSealer())
    # The store's pool runs with jit = off; so does this connection, for the same plans.
    con = await asyncpg.connect(url, server_settings={"jit": "off"})
    try:
        await store.connect()
        await store.migrate()
        await build(con, opts.final, opts.queued, opts.running)
        await report(con, store, opts)
    finally:
        await con.close()
        await store.close()
        if not opts.keep:
            await drop_database(opts.dsn, opts.db)


if __name__ == "__main__":
    asyncio.run(main())
