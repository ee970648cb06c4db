"""Store throughput: submit and drain through the Store protocol alone, per engine.

For each engine (a fresh SQLite file, a fresh Postgres schema) this measures

- bulk submit: ``submit_many`` of ``--runs`` runs in batches of ``--batch``;
- single submit: ``submit`` one at a time, ``--single`` runs (the idempotency and depth
  gate path a producer takes);
- drain: every queued run claimed and completed with ``--slots`` concurrent slots, the way
  the daemon's claimer does it (claim as many as there are free slots in one statement,
  execute, batch completions for a few milliseconds into one ``complete_many``).

With ``--plain-seal`` every engine runs twice, sealed (AES-GCM, the default) and with
``runq.seal.PlainSealer``, so the cost of sealing shows as a ratio in one run.
``--repeat N`` runs every variant N times (alternating) and reports medians, since a shared
machine's disk makes single rounds noisy. Prints a table, then one JSON line
(``RESULT {...}``, like the other bench scripts).

    .venv/bin/python bench/store_bench.py --plain-seal
    .venv/bin/python bench/store_bench.py --engines sqlite --runs 5000 --single 500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import asyncpg

from runq.model import Completion, NewRun
from runq.seal import KeyRing, PlainSealer, Sealer
from runq.store import make_store
from runq.store.base import Store

DEFAULT_PG_URL = os.environ.get(
    "RUNQ_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
#: How long completions wait to be batched into one statement.
COMPLETION_BATCH_SECONDS = 0.002
PAYLOAD = {"prompt": "summarise the quarterly report", "options": {"max_tokens": 256}}


@dataclass
class Result:
    engine: str
    seal: str
    runs: int
    single: int
    slots: int
    submit_many_per_s: float
    submit_per_s: float
    drain_per_s: float
    drain_seconds: float


def log(message: str) -> None:
    print(f"  {message}", file=sys.stderr, flush=True)


def new_runs(n: int) -> list[NewRun]:
    return [
        NewRun(component_type="task", component_id="echo", payload={**PAYLOAD, "i": i})
        for i in range(n)
    ]


async def bulk_submit(store: Store, runs: int, batch: int) -> float:
    started = time.perf_counter()
    for start in range(0, runs, batch):
        await store.submit_many(new_runs(min(batch, runs - start)))
    return runs / (time.perf_counter() - started)


async def single_submit(store: Store, n: int) -> float:
    started = time.perf_counter()
    for new in new_runs(n):
        await store.submit(new, max_queue_depth=0)
    return n / (time.perf_counter() - started) if n else 0.0


class Drainer:
    """``slots`` concurrent executions fed by one claimer, completed in short batches."""

    def __init__(self, store: Store, slots: int, total: int) -> None:
        self.store = store
        self.slots = slots
        self.total = total
        self.in_flight = 0
        self.done = 0
        self.pending: list[Completion] = []
        self.slot_freed = asyncio.Event()
        self.work_done = asyncio.Event()
        self.finished = asyncio.Event()

    async def run(self) -> float:
        started = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.completer())
            await self.claimer(tg)
        return time.perf_counter() - started

    async def claimer(self, tg: asyncio.TaskGroup) -> None:
        idle_polls = 0
        while self.done < self.total:
            free = self.slots - self.in_flight
            if free == 0:
                self.slot_freed.clear()
                await self.slot_freed.wait()
                continue
            runs = await self.store.claim("bench", free, deployment_id=None)
            if not runs:
                if self.in_flight == 0:
                    idle_polls += 1
                    if idle_polls > 1000:
                        raise RuntimeError(f"nothing to claim after {self.done}/{self.total}")
                    await asyncio.sleep(0.001)
                else:
                    self.slot_freed.clear()
                    await self.slot_freed.wait()
                continue
            idle_polls = 0
            self.in_flight += len(runs)
            for run in runs:
                tg.create_task(self.execute(run.id, run.attempt))
        self.finished.set()
        self.work_done.set()

    async def execute(self, run_id: str, attempt: int) -> None:
        await asyncio.sleep(0)  # the handler: a no-op that yields once
        self.pending.append(Completion(run_id=run_id, attempt=attempt, answer={"ok": True}))
        self.work_done.set()

    async def completer(self) -> None:
        while not self.finished.is_set():
            await self.work_done.wait()
            self.work_done.clear()
            if not self.pending:
                continue
            if len(self.pending) < self.in_flight:
                await asyncio.sleep(COMPLETION_BATCH_SECONDS)
            batch, self.pending = self.pending, []
            result = await self.store.complete_many("bench", batch)
            if result.fenced_off:
                raise RuntimeError(f"{len(result.fenced_off)} completions fenced off")
            self.in_flight -= len(batch)
            self.done += len(result.applied)
            self.slot_freed.set()


async def open_fresh(engine: str, sealer: Sealer, pg_url: str, tmp: Path) -> tuple[Store, str]:
    if engine == "sqlite":
        path = tmp / f"bench-{secrets.token_hex(4)}.db"
        store = make_store(f"sqlite:///{path}", schema="runq", sealer=sealer)
        schema = "runq"
    else:
        schema = f"runq_bench_{secrets.token_hex(4)}"
        store = make_store(pg_url, schema=schema, sealer=sealer)
    await store.connect()
    await store.migrate()
    return store, schema


async def drop_pg_schema(pg_url: str, schema: str) -> None:
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    finally:
        await conn.close()


async def bench_one(engine: str, seal: str, args: argparse.Namespace, tmp: Path) -> Result:
    sealer: Sealer = PlainSealer() if seal == "plain" else KeyRing([os.urandom(32)])
    store, schema = await open_fresh(engine, sealer, args.pg_url, tmp)
    try:
        log(f"{engine}/{seal}: submit_many {args.runs:,} runs")
        many_rate = await bulk_submit(store, args.runs, args.batch)
        log(f"{engine}/{seal}: submit {args.single:,} runs one by one")
        single_rate = await single_submit(store, args.single)
        total = args.runs + args.single
        log(f"{engine}/{seal}: drain {total:,} runs with {args.slots} slots")
        seconds = await Drainer(store, args.slots, total).run()
        counts = (await store.stats()).counts
        if counts.get("completed", 0) != total:
            raise RuntimeError(f"drain left {counts}")
        return Result(
            engine=engine,
            seal=seal,
            runs=args.runs,
            single=args.single,
            slots=args.slots,
            submit_many_per_s=round(many_rate, 1),
            submit_per_s=round(single_rate, 1),
            drain_per_s=round(total / seconds, 1),
            drain_seconds=round(seconds, 3),
        )
    finally:
        await store.close()
        if engine == "postgres":
            await drop_pg_schema(args.pg_url, schema)


async def postgres_reachable(url: str) -> str | None:
    try:
        conn = await asyncpg.connect(url, timeout=5)
    except (OSError, asyncpg.PostgresError, TimeoutError) as e:
        return str(e)
    await conn.close()
    return None


def median_result(rounds: list[Result]) -> Result:
    """Field by field median of repeated rounds of one (engine, seal)."""

    def med(field: str) -> float:
        return round(statistics.median(getattr(r, field) for r in rounds), 3)

    first = rounds[0]
    return Result(
        engine=first.engine,
        seal=first.seal,
        runs=first.runs,
        single=first.single,
        slots=first.slots,
        submit_many_per_s=med("submit_many_per_s"),
        submit_per_s=med("submit_per_s"),
        drain_per_s=med("drain_per_s"),
        drain_seconds=med("drain_seconds"),
    )


def table(results: list[Result]) -> str:
    header = f"{'engine':<9}{'seal':<7}{'submit_many/s':>15}{'submit/s':>11}{'drain/s':>10}"
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r.engine:<9}{r.seal:<7}{r.submit_many_per_s:>15,.0f}"
            f"{r.submit_per_s:>11,.0f}{r.drain_per_s:>10,.0f}"
        )
    return "\n".join(lines)


def seal_ratios(results: list[Result]) -> dict[str, dict[str, float]]:
    """Per engine, sealed throughput as a fraction of plain (1.0 = sealing is free)."""
    ratios: dict[str, dict[str, float]] = {}
    by_key = {(r.engine, r.seal): r for r in results}
    for engine in {r.engine for r in results}:
        sealed, plain = by_key.get((engine, "aesgcm")), by_key.get((engine, "plain"))
        if sealed and plain:
            ratios[engine] = {
                field: round(getattr(sealed, field) / getattr(plain, field), 3)
                for field in ("submit_many_per_s", "submit_per_s", "drain_per_s")
                if getattr(plain, field)
            }
    return ratios


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    seals = ["aesgcm", "plain"] if args.plain_seal else ["aesgcm"]
    results: list[Result] = []
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="runq-store-bench-") as tmp:
        for engine in engines:
            if engine == "postgres":
                reason = await postgres_reachable(args.pg_url)
                if reason is not None:
                    skipped[engine] = reason
                    log(f"postgres skipped: {reason}")
                    continue
            # Alternate sealed and plain rounds so drift on a shared machine hits both alike.
            rounds: dict[str, list[Result]] = {seal: [] for seal in seals}
            for _ in range(args.repeat):
                for seal in seals:
                    rounds[seal].append(await bench_one(engine, seal, args, Path(tmp)))
            results.extend(median_result(rs) for rs in rounds.values())
    print(table(results))
    ratios = seal_ratios(results)
    for engine, r in sorted(ratios.items()):
        print(f"{engine}: sealed/plain " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()))
    return {
        "bench": "store",
        "results": [asdict(r) for r in results],
        "sealed_over_plain": ratios,
        "skipped": skipped,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20_000, help="runs for submit_many")
    parser.add_argument("--single", type=int, default=2_000, help="runs submitted one by one")
    parser.add_argument("--batch", type=int, default=1_000, help="submit_many batch size")
    parser.add_argument("--slots", type=int, default=16, help="concurrent execution slots")
    parser.add_argument("--engines", default="sqlite,postgres", help="comma-separated")
    parser.add_argument(
        "--plain-seal",
        action="store_true",
        help="also run with PlainSealer and report sealed/plain ratios",
    )
    parser.add_argument(
        "--repeat", type=int, default=1, help="rounds per variant; the median is reported"
    )
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL)
    args = parser.parse_args(argv)
    if min(args.runs, args.batch, args.slots, args.repeat) < 1 or args.single < 0:
        parser.error("--runs, --batch, --slots and --repeat must be >= 1, --single >= 0")
    for engine in args.engines.split(","):
        if engine.strip() not in ("sqlite", "postgres"):
            parser.error(f"unknown engine {engine!r} (sqlite, postgres)")
    return args


def main(argv: list[str] | None = None) -> int:
    summary = asyncio.run(main_async(parse_args(argv)))
    print("RESULT " + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
