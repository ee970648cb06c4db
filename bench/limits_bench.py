"""What fleet-wide limits cost the claim, on PostgreSQL, one in-process worker.

    .venv/bin/python bench/limits_bench.py [--runs 5000] [--repeat 3] [--dsn DSN]

Four drains of ``--runs`` no-op runs, each in a fresh schema, interleaved and repeated;
the worker is runq's supervisor (what ``runq serve`` runs) on this process's standard
asyncio loop, ``"*" = "postgres"``, HTTP off:

- ``plain``: W1 as in bench/README.md (``max_concurrency = 16``, no ``[limits]``);
- ``unbound``: the same with ``[limits."task/*"] max_running = 100000``, a limit that
  never binds: what the limits lock and count cost each claim;
- ``bound4``: ``max_concurrency = 16`` with ``[limits."task/*"] max_running = 4``;
- ``conc4``: no limits, ``max_concurrency = 4``: the per-process cap the limit replaces.

Drain rate = runs / (last ``completed_at`` - worker start). Reported: the medians and the
ratios unbound/plain (target >= 0.8) and bound4/conc4.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import asyncpg

from runq.config import load_config
from runq.log import configure_logging
from runq.queue import Queue
from runq.seal import generate_key
from runq.serve.supervisor import Supervisor

DSN = os.environ.get("RUNQ_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/test")
VARIANTS: dict[str, tuple[int, int | None]] = {
    # name: (max_concurrency, max_running of task/* or None)
    "plain": (16, None),
    "unbound": (16, 100_000),
    "bound4": (16, 4),
    "conc4": (4, None),
}


async def noop(ctx: Any, payload: Any) -> None:
    return None


def write_config(path: Path, schema: str, concurrency: int, max_running: int | None) -> Path:
    limits = f'[limits."task/*"]\nmax_running = {max_running}\n' if max_running else ""
    path.write_text(
        f"""[store]
url = "{DSN}"
schema = "{schema}"

[seal]
keys = ["env:RUNQ_SEAL_KEY"]

[queue]
max_concurrency = {concurrency}
max_queue_depth = 0

[http]
listen = ""

[routing]
"*" = "postgres"

[components]
"task/noop" = "limits_bench:noop"

{limits}""",
        encoding="utf-8",
    )
    return path


async def drain(variant: str, runs: int, workdir: Path) -> float:
    concurrency, max_running = VARIANTS[variant]
    schema = f"limbench_{secrets.token_hex(4)}"
    cfg = write_config(workdir / f"{schema}.toml", schema, concurrency, max_running)
    config = load_config(cfg)
    conn = await asyncpg.connect(DSN)
    try:
        async with Queue.open(config=config) as q:
            for start in range(0, runs, 1000):
                k = min(1000, runs - start)
                await q.store.submit_many([q.new_run("task", "noop") for _ in range(k)])
            remaining = f"SELECT count(*) FROM {schema}.runs WHERE status <> 'completed'"
            began = await q.store.now()
            async with Queue.open(config=config, migrate=False) as worker_queue:
                supervisor = Supervisor(worker_queue)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(supervisor.run)
                    deadline = time.monotonic() + 600
                    while await conn.fetchval(remaining) > 0:
                        if time.monotonic() > deadline:
                            raise TimeoutError(f"{variant}: drain did not finish")
                        await anyio.sleep(0.05)
                    supervisor.request_stop()
            last = await conn.fetchval(f"SELECT max(completed_at) FROM {schema}.runs")
            return float(runs / (last - began))
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await conn.close()


async def main_async(args: argparse.Namespace) -> None:
    workdir = Path(args.workdir)
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for rep in range(args.repeat):
        for variant in VARIANTS:  # interleaved: background load hits every variant alike
            rate = await drain(variant, args.runs, workdir)
            rates[variant].append(rate)
            print(f"rep {rep + 1} {variant:8s} {rate:8.1f} runs/s", flush=True)
    med = {v: statistics.median(r) for v, r in rates.items()}
    print(f"\nmedians over {args.repeat} repetitions of {args.runs} runs (runs/s):")
    for v, m in med.items():
        print(f"  {v:8s} {m:8.1f}")
    print(f"unbound / plain = {med['unbound'] / med['plain']:.2f}  (target >= 0.8)")
    print(f"bound4 / conc4  = {med['bound4'] / med['conc4']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", default="/tmp/runq-limits-bench")
    args = parser.parse_args()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # "limits_bench:noop"
    os.environ.setdefault("RUNQ_SEAL_KEY", generate_key())
    configure_logging("json", level=logging.WARNING)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
