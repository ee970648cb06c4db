"""Where a bulk submit's time goes on PostgreSQL: the database's share and the client's.

    .venv/bin/python bench/submit_floor.py [--runs 20000] [--repeat 5] [--dsn DSN]

Database share: ``--runs`` rows as one binary COPY per 1,000 (what ``Queue.defer_many``
sends), each batch in its own transaction, into runq's run table (migrated in a fresh
schema), under four variants of the ``submitted`` event, interleaved and repeated:

- ``row_trigger``: the per-row trigger of migration 0004 (one plpgsql call and one
  single-row INSERT into run_events per run);
- ``statement_trigger``: the statement-level trigger of migration 0013 (what runq runs);
- ``no_fk``: the statement-level trigger without the run_events -> runs foreign key;
- ``no_trigger``: no event at all: the run row and its indexes only.

The rows are built before the clock starts, so the rates are the database's alone.
Client share: ``Queue.defer_many`` of ``--runs`` runs (sealed) in batches of 1,000, with
the process CPU time per run (``time.process_time``): what Python spends per run.

Reported: the median and best rate of each variant, and the client CPU per run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_components

from runq.config import Config, QueueConfig, SealConfig, StoreConfig
from runq.ids import new_run_ids
from runq.queue import Queue
from runq.seal import generate_key
from runq.store.postgres.statements import SUBMIT_COPY_COLUMNS

DEFAULT_DSN = os.environ.get("RUNQ_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/test")
BATCH = 1000
SCHEMA = "runq_submit_floor"

SUBMITTED_FUNCTION = f"""
    CREATE OR REPLACE FUNCTION {SCHEMA}.runq_submitted_events() RETURNS trigger
    LANGUAGE plpgsql AS $body$
    BEGIN
        INSERT INTO {SCHEMA}.run_events (run_id, seq, attempt, at, kind)
        SELECT id, event_seq, attempt, created_at, 'submitted' FROM submitted_runs;
        RETURN NULL;
    END
    $body$"""
STATEMENT_TRIGGER = f"""
    DROP TRIGGER IF EXISTS runs_event_submitted ON {SCHEMA}.runs;
    CREATE TRIGGER runs_event_submitted AFTER INSERT ON {SCHEMA}.runs
        REFERENCING NEW TABLE AS submitted_runs
        FOR EACH STATEMENT EXECUTE FUNCTION {SCHEMA}.runq_submitted_events()"""
NO_TRIGGER = f"DROP TRIGGER IF EXISTS runs_event_submitted ON {SCHEMA}.runs"
DROP_FK = f"ALTER TABLE {SCHEMA}.run_events DROP CONSTRAINT IF EXISTS run_events_run_id_fkey"
ADD_FK = f"""{DROP_FK};
    ALTER TABLE {SCHEMA}.run_events ADD CONSTRAINT run_events_run_id_fkey
        FOREIGN KEY (run_id) REFERENCES {SCHEMA}.runs (id) ON DELETE CASCADE NOT VALID"""
COUNTS_ON = f"""
    DROP TRIGGER IF EXISTS runs_count_insert ON {SCHEMA}.runs;
    CREATE TRIGGER runs_count_insert AFTER INSERT ON {SCHEMA}.runs
        REFERENCING NEW TABLE AS runq_new
        FOR EACH STATEMENT EXECUTE FUNCTION {SCHEMA}.runq_count_runs()"""
COUNTS_OFF = f"DROP TRIGGER IF EXISTS runs_count_insert ON {SCHEMA}.runs"
#: The ``submitted`` event as migrations 0013 and 0014 store it (0014 stores none).
VARIANTS = {
    "0013_statement_trigger": [SUBMITTED_FUNCTION, ADD_FK, STATEMENT_TRIGGER, COUNTS_ON],
    "0014_no_event_row": [DROP_FK, NO_TRIGGER, COUNTS_ON],
    "0014_without_counts": [DROP_FK, NO_TRIGGER, COUNTS_OFF],
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def config(dsn: str) -> Config:
    return Config(
        store=StoreConfig(url=dsn, schema=SCHEMA),
        queue=QueueConfig(max_queue_depth=0),
        seal=SealConfig(keys=("env:RUNQ_SEAL_KEY",)),
        routing={"*": "postgres"},
        components={"task/noop": "bench_components:noop"},
    )


def records(n: int) -> list[tuple[Any, ...]]:
    """Rows as ``Queue.defer_many`` copies them: a 60-byte sealed payload each."""
    now = time.time()
    head = ("task", "noop", "queued", 0, 1, 0, None, None, '{"user_id":null}', None, "", None)
    return [
        (rid, *head, "python", now, now, now, True, os.urandom(60), None, None)
        for rid in new_run_ids(n)
    ]


async def copy_rate(con: asyncpg.Connection, runs: int) -> float:
    batches = [records(BATCH) for _ in range(runs // BATCH)]
    await con.execute(f"TRUNCATE {SCHEMA}.runs, {SCHEMA}.run_events")
    started = time.perf_counter()
    for rows in batches:
        async with con.transaction():
            await con.copy_records_to_table(
                "runs", schema_name=SCHEMA, columns=SUBMIT_COPY_COLUMNS, records=rows
            )
    return len(batches) * BATCH / (time.perf_counter() - started)


async def client_share(q: Queue, runs: int) -> tuple[float, float]:
    """(runs/s, client CPU microseconds per run) of defer_many."""
    wall, cpu = time.perf_counter(), time.process_time()
    for start in range(0, runs, BATCH):
        await q.defer_many([q.new_run("task", "noop", {"i": start + j}) for j in range(BATCH)])
    return runs / (time.perf_counter() - wall), (time.process_time() - cpu) / runs * 1e6


async def main_async(args: argparse.Namespace) -> None:
    os.environ.setdefault("RUNQ_SEAL_KEY", generate_key())
    admin = await asyncpg.connect(args.dsn)
    await admin.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    client: list[tuple[float, float]] = []
    try:
        async with Queue.open(config=config(args.dsn)) as q:
            for rep in range(args.repeat):
                for name, ddl in VARIANTS.items():
                    for statement in ddl:
                        await admin.execute(statement)
                    rates[name].append(await copy_rate(admin, args.runs))
                    log(f"rep {rep + 1} {name}: {rates[name][-1]:,.0f} rows/s")
                await admin.execute(f"TRUNCATE {SCHEMA}.runs, {SCHEMA}.run_events")
                client.append(await client_share(q, args.runs))
                log(f"rep {rep + 1} defer_many: {client[-1][0]:,.0f} runs/s")
    finally:
        await admin.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        await admin.close()
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    print("| variant | COPY rows/s (median) | best |")
    print("| --- | ---: | ---: |")
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values):,.0f} | {max(values):,.0f} |")
    print(
        f"\nQueue.defer_many: {statistics.median(r for r, _ in client):,.0f} runs/s, "
        f"client CPU {statistics.median(c for _, c in client):.1f} us/run (medians)"
    )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", type=int, default=20000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--dsn", default=DEFAULT_DSN)
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
