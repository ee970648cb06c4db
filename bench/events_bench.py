"""Events: how fast one run can emit, what events cost W1, and emit → client latency.

    .venv/bin/python bench/events_bench.py [--dsn DSN] [--runs 5000] [--events 10000] [--reps 3]

On PostgreSQL (a fresh schema, dropped at the end), with runq's supervisor hosted in this
process (what ``runq serve`` runs) as replica A:

1. **events/s**: one run emitting ``--events`` ``delta`` events in a tight loop; the rate is
   the events divided by the database time from its ``claimed`` to its ``completed`` event
   (the writer's last flush included).
2. **W1 ratio**: ``--runs`` no-op runs drained (first ``started_at`` to last
   ``completed_at``) three ways: without the lifecycle triggers (the schema as before the
   event log), with them, and with every run also emitting 10 events; ``--reps`` rounds of
   the three in turn, so background load hits each alike; medians of the rates, of the
   worker CPU per run and of each round's ratio. Target: with 10 events ÷ without events
   ≥ 0.6.
3. **latency**: replica B, a ``runq serve`` subprocess on the same schema, serves
   ``GET /runs/{id}/events`` to a client here while replica A executes a run that emits an
   event with its wall time every 20 ms; latency is arrival minus emit time, p50/p99.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import httpx
import msgspec

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

from runq.config import load_config  # noqa: E402
from runq.context import RunContext  # noqa: E402
from runq.queue import Queue  # noqa: E402
from runq.seal import generate_key  # noqa: E402
from runq.serve.supervisor import Supervisor  # noqa: E402

DEFAULT_DSN = os.environ.get("RUNQ_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/test")


# -- handlers (loaded by the supervisor as events_bench:NAME) -------------------------------


async def noop(ctx: RunContext, payload: Any) -> None:
    return None


async def emit_ten(ctx: RunContext, payload: Any) -> None:
    for i in range(10):
        await ctx.emit("progress", {"i": i})


async def emit_many(ctx: RunContext, payload: Any) -> None:
    for i in range(int(payload["n"])):
        await ctx.emit("delta", {"i": i, "text": "token"})


async def emit_timed(ctx: RunContext, payload: Any) -> None:
    for _ in range(int(payload["n"])):
        await ctx.emit("delta", {"t": time.time()})
        await anyio.sleep(0.02)


# -- setup ----------------------------------------------------------------------------------


def write_config(path: Path, dsn: str, schema: str, deployment: str, listen: str = "") -> Path:
    path.write_text(
        f"""[store]
url = "{dsn}"
schema = "{schema}"

[queue]
max_concurrency = 16
max_queue_depth = 0
deployment_id = "{deployment}"

[http]
listen = "{listen}"

[seal]
keys = ["env:RUNQ_SEAL_KEY"]

[privacy]
level = "full"

[routing]
"*" = "postgres"

[components]
"task/noop" = "events_bench:noop"
"task/noop_again" = "events_bench:noop"
"task/emit_ten" = "events_bench:emit_ten"
"task/emit_many" = "events_bench:emit_many"
"task/emit_timed" = "events_bench:emit_timed"
"""
    )
    return path


async def drain(q: Queue, schema: str, component: str, n: int, dsn: str) -> tuple[float, float]:
    """(runs per second, worker CPU ms per run) of a drain of ``n`` runs of ``component`` by
    an in-process worker. The CPU is this process's from the worker's start to the end of
    the drain (its polling included), so it also counts what the emits cost."""
    for start in range(0, n, 1000):
        news = [q.new_run("task", component, {"i": i}) for i in range(start, min(n, start + 1000))]
        await q.store.submit_many(news)
    con = await asyncpg.connect(dsn)
    try:
        cpu_start = time.process_time()
        async with anyio.create_task_group() as tg:
            supervisor = await start_worker(q, tg)
            while await con.fetchval(  # noqa: ASYNC110 - polls the database, not a flag
                f"SELECT count(*) FROM {schema}.runs WHERE component_id = $1 "
                "AND status <> 'completed'",
                component,
            ):
                await anyio.sleep(0.1)
            cpu = time.process_time() - cpu_start
            supervisor.request_stop()
        first, last = await con.fetchrow(
            f"SELECT min(started_at), max(completed_at) FROM {schema}.runs WHERE component_id = $1",
            component,
        )
    finally:
        await con.close()
    return n / (last - first), cpu * 1000 / n


async def start_worker(q: Queue, tg: Any) -> Supervisor:
    worker_q = await tg.start(_hosted_queue, q)
    return worker_q


async def _hosted_queue(q: Queue, *, task_status: Any) -> None:
    async with Queue.open(config=q.config, migrate=False) as worker_queue:
        supervisor = Supervisor(worker_queue)
        task_status.started(supervisor)
        await supervisor.run()


async def one_run_rate(q: Queue, dsn: str, n: int) -> float:
    run = (await q.store.submit(q.new_run("task", "emit_many", {"n": n}), max_queue_depth=0)).run
    async with anyio.create_task_group() as tg:
        supervisor = await start_worker(q, tg)
        done = await q.wait(run.id, timeout=600)
        supervisor.request_stop()
    assert done.status == "completed", done
    events = await q.store.list_events(run.id, after=0, limit=n + 10)
    claimed = next(e for e in events if e.kind == "claimed")
    completed = events[-1]
    assert completed.kind == "completed"
    assert sum(e.kind == "delta" for e in events) == n
    return n / (completed.at - claimed.at)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def latency(q: Queue, workdir: Path, dsn: str, schema: str, n: int) -> list[float]:
    port = free_port()
    cfg_b = write_config(workdir / "b.toml", dsn, schema, "b", f"127.0.0.1:{port}")
    env = {**os.environ, "PYTHONPATH": f"{BENCH_DIR}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    runq = str(Path(sys.executable).parent / "runq")
    replica_b = subprocess.Popen(  # noqa: ASYNC220 - started once, before measuring
        [runq, "serve", "--config", str(cfg_b)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(workdir / "b.log").open("w"),
    )
    base = f"http://127.0.0.1:{port}"
    samples: list[float] = []
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            for _ in range(300):
                try:
                    if (await client.get(f"{base}/healthz")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await anyio.sleep(0.1)
            new = q.new_run("task", "emit_timed", {"n": n}, deployment_id="a")
            run = (await q.store.submit(new, max_queue_depth=0)).run
            async with anyio.create_task_group() as tg:
                supervisor = await start_worker(q, tg)
                async with client.stream("GET", f"{base}/runs/{run.id}/events") as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            event = msgspec.json.decode(line[6:])
                            if event["kind"] == "delta":
                                samples.append(time.time() - event["data"]["t"])
                supervisor.request_stop()
    finally:
        replica_b.terminate()
        replica_b.wait(30)
    return samples


async def w1_ratios(q: Queue, schema: str, args: argparse.Namespace) -> dict[str, Any]:
    """The three W1 drains, ``--reps`` times in turn (so background load hits each alike);
    medians of the rates, of the CPU per run and of each round's ratios."""
    rates: dict[str, list[float]] = {"bare": [], "lifecycle": [], "ten": []}
    cpu: dict[str, list[float]] = {"bare": [], "lifecycle": [], "ten": []}
    con = await asyncpg.connect(args.dsn)
    try:
        for _ in range(args.reps):
            await con.execute(f"ALTER TABLE {schema}.runs DISABLE TRIGGER USER")
            rate, ms = await drain(q, schema, "noop", args.runs, args.dsn)
            await con.execute(f"ALTER TABLE {schema}.runs ENABLE TRIGGER USER")
            rates["bare"].append(rate)
            cpu["bare"].append(ms)
            # The same no-op drain with the lifecycle triggers on, then with 10 events per
            # run (each its own component id, so no drain counts another's runs).
            for name, component in (("lifecycle", "noop_again"), ("ten", "emit_ten")):
                rate, ms = await drain(q, schema, component, args.runs, args.dsn)
                rates[name].append(rate)
                cpu[name].append(ms)
            # Every round starts from the same empty tables (a drain's window is over its
            # component's runs, so an earlier round's must be gone).
            await con.execute(f"DELETE FROM {schema}.runs")
            await con.execute(f"VACUUM ANALYZE {schema}.runs, {schema}.run_events")
    finally:
        await con.close()
    median = statistics.median
    return {
        "w1_reps": args.reps,
        "w1_runs_per_second_without_events": round(median(rates["bare"])),
        "w1_runs_per_second_lifecycle_events": round(median(rates["lifecycle"])),
        "w1_runs_per_second_10_events_each": round(median(rates["ten"])),
        "w1_cpu_ms_per_run_without_events": round(median(cpu["bare"]), 3),
        "w1_cpu_ms_per_run_lifecycle_events": round(median(cpu["lifecycle"]), 3),
        "w1_cpu_ms_per_run_10_events_each": round(median(cpu["ten"]), 3),
        "w1_ratio_10_events": round(
            median(t / b for t, b in zip(rates["ten"], rates["bare"], strict=True)), 3
        ),
        "w1_ratio_lifecycle_only": round(
            median(t / b for t, b in zip(rates["lifecycle"], rates["bare"], strict=True)), 3
        ),
        "w1_ratios_10_events_each_rep": [
            round(t / b, 3) for t, b in zip(rates["ten"], rates["bare"], strict=True)
        ],
    }


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dsn", default=DEFAULT_DSN)
    p.add_argument("--runs", type=int, default=5000)
    p.add_argument("--events", type=int, default=10_000)
    p.add_argument("--latency-events", type=int, default=250)
    p.add_argument("--reps", type=int, default=3, help="rounds of the three W1 drains")
    args = p.parse_args()
    os.environ.setdefault("RUNQ_SEAL_KEY", generate_key())
    workdir = Path(tempfile.mkdtemp(prefix="runq-events-bench-"))  # configs and B's log
    schema = f"events_bench_{os.getpid()}"
    config = load_config(
        write_config(workdir / "a.toml", args.dsn, schema, "a"), environ=os.environ
    )
    results: dict[str, Any] = {}
    try:
        async with Queue.open(config=config) as q:
            results["events_per_second_one_run"] = round(
                await one_run_rate(q, args.dsn, args.events)
            )
            results.update(await w1_ratios(q, schema, args))
            samples = await latency(q, workdir, args.dsn, schema, args.latency_events)
            samples.sort()
            results["latency_samples"] = len(samples)
            results["latency_p50_ms"] = round(statistics.median(samples) * 1000, 1)
            results["latency_p99_ms"] = round(samples[int(len(samples) * 0.99) - 1] * 1000, 1)
    finally:
        con = await asyncpg.connect(args.dsn)
        await con.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        await con.close()
    print(msgspec.json.format(msgspec.json.encode(results), indent=2).decode())


if __name__ == "__main__":
    anyio.run(main)
