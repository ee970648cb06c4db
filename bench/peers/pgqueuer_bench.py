"""PgQueuer side of the bench. Runs in bench/.peers/venv (never runq's environment).

    python pgqueuer_bench.py run --workload W1|W2|W3 --dsn DSN [--runs N] ...
    python pgqueuer_bench.py worker --dsn DSN [--latency-file F --expect N]
    python pgqueuer_bench.py run --inproc ...   # the worker in the driver, standard loop

The worker is what ``pgq run`` builds: one asyncpg connection, a ``QueueManager`` with
one entrypoint, ``uvloop``; concurrency 16 is ``max_concurrent_tasks=16`` (which PgQueuer
allows with ``batch_size`` at most 8: it requires max_concurrent_tasks >= 2 * batch_size).
With ``--inproc`` the same ``QueueManager`` runs as a task of the driver on the standard
asyncio loop (W2's producer is then a ``produce`` subprocess).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import common
from pgqueuer import __version__ as PGQ_VERSION
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries

ENTRYPOINT = "noop"
OTHER = "other_service"
BATCH_SIZE = 8  # the largest PgQueuer accepts with max_concurrent_tasks=16


# -- worker process -------------------------------------------------------------------------


def build_manager(
    conn: asyncpg.Connection, args: argparse.Namespace, latencies: list[float]
) -> QueueManager:
    """The worker's ``QueueManager`` with the no-op entrypoint; a payload with ``t`` (W2)
    appends its start latency to ``latencies``, written to ``--latency-file`` once all
    ``--expect`` arrived (the subprocess worker)."""
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    written = False
    hit = common.PROBE.hit

    @qm.entrypoint(ENTRYPOINT, concurrency_limit=args.concurrency if per_entrypoint() else 0)
    async def noop(job: Job) -> None:
        nonlocal written
        hit()
        if job.payload and b'"t"' in job.payload:
            started = time.time()
            body = json.loads(job.payload)
            latencies.append(started - body["t"])
            if args.latency_file and len(latencies) >= args.expect and not written:
                written = True
                common.write_json_atomically(args.latency_file, latencies)

    return qm


def per_entrypoint() -> bool:
    # PGQ_BENCH_LIMIT=entrypoint: the other way to cap at 16 (a per-entrypoint limit enforced
    # in SQL, batch 16). Measured slower here (2.5-2.7k vs 3.3-4.2k runs/s), so the default
    # is the per-worker cap with batch 8: PgQueuer's best at concurrency 16.
    return os.environ.get("PGQ_BENCH_LIMIT") == "entrypoint"


async def run_manager(qm: QueueManager, args: argparse.Namespace) -> None:
    await qm.run(
        batch_size=args.concurrency if per_entrypoint() else BATCH_SIZE,
        max_concurrent_tasks=None if per_entrypoint() else args.concurrency,
        dequeue_timeout=timedelta(seconds=30),
    )


async def worker_main(args: argparse.Namespace) -> None:
    conn = await asyncpg.connect(args.dsn)
    qm = build_manager(conn, args, [])
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, qm.shutdown.set)
    await run_manager(qm, args)


class InprocWorker:
    """The worker as a task of this process (standard asyncio loop), on its own
    connection; stopped the way SIGTERM stops ``pgq run`` (``shutdown`` set)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.latencies: list[float] = []

    async def __aenter__(self) -> InprocWorker:
        self.conn = await asyncpg.connect(self.args.dsn)
        self.qm = build_manager(self.conn, self.args, self.latencies)
        self.task = asyncio.create_task(run_manager(self.qm, self.args))
        self.alive = common.TaskAlive(self.task)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.qm.shutdown.set()
        try:
            await asyncio.wait_for(self.task, 30)
        finally:
            await self.conn.close()


# -- driver ---------------------------------------------------------------------------------


async def install(conn: asyncpg.Connection) -> Queries:
    q = Queries(AsyncpgDriver(conn))
    await q.install()
    return q


async def remaining(conn: asyncpg.Connection) -> int:
    # The status filter lets the planner use PgQueuer's partial indexes instead of scanning
    # the whole table (200,000 foreign jobs in W3) ten times a second.
    return await conn.fetchval(
        "SELECT count(*) FROM pgqueuer WHERE entrypoint = $1 AND status IN ('queued', 'picked')",
        ENTRYPOINT,
    )


async def bulk_submit(q: Queries, n: int, batch: int) -> float:
    t0 = time.perf_counter()
    for start in range(0, n, batch):
        k = min(batch, n - start)
        await q.enqueue(
            [ENTRYPOINT] * k,
            [json.dumps({"i": start + j}).encode() for j in range(k)],
            [0] * k,
        )
    return n / (time.perf_counter() - t0)


async def prefill(conn: asyncpg.Connection, final: int, foreign: int) -> None:
    """PgQueuer deletes a finished job and keeps its history in pgqueuer_log: the
    equivalent of 'final runs' is that history (the 'queued' and the 'successful' row of
    each job, already aggregated); 'runs the worker does not serve' are queued jobs of an
    entrypoint this worker has not registered."""
    await conn.execute(
        """
        INSERT INTO pgqueuer_log (created, job_id, status, priority, entrypoint, aggregated)
        SELECT now() - interval '1 hour', g, s::pgqueuer_status, 0, $2, true
        FROM generate_series(1, $1) g, unnest(ARRAY['queued', 'successful']) s
        """,
        final,
        ENTRYPOINT,
    )
    await conn.execute(
        """
        INSERT INTO pgqueuer (priority, entrypoint, payload, status)
        SELECT 0, $2, convert_to('{"i":' || g || '}', 'UTF8'), 'queued'
        FROM generate_series(1, $1) g
        """,
        foreign,
        OTHER,
    )
    await conn.execute("VACUUM ANALYZE pgqueuer")
    await conn.execute("VACUUM ANALYZE pgqueuer_log")


def spawn_worker(args: argparse.Namespace, extra: list[str], log_path: Path):  # type: ignore[no-untyped-def]
    cmd = [
        sys.executable,
        __file__,
        "worker",
        "--dsn",
        args.dsn,
        "--concurrency",
        str(args.concurrency),
        *extra,
    ]
    return common.start_process(cmd, log_path=log_path)


async def completion_window(
    conn: asyncpg.Connection, since: float
) -> tuple[int, float | None, float | None]:
    row = await conn.fetchrow(
        """SELECT count(*) AS n, extract(epoch FROM min(created))::float8 AS a,
                  extract(epoch FROM max(created))::float8 AS b
           FROM pgqueuer_log WHERE status = 'successful' AND entrypoint = $1
             AND created > to_timestamp($2)""",
        ENTRYPOINT,
        since,
    )
    return row["n"], row["a"], row["b"]


async def drain_workload(args: argparse.Namespace, conn: asyncpg.Connection, q: Queries) -> dict:
    n = args.runs
    if args.workload == "W3":
        common.log(f"prefill {args.final} final + {args.foreign} foreign")
        await prefill(conn, args.final, args.foreign)
    common.log(f"bulk submit {n}")
    submit_rate = await bulk_submit(q, n, args.batch)
    since = await conn.fetchval("SELECT extract(epoch FROM now())::float8")
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    x0 = await conn.fetchval(common.XACT_SQL)
    if args.inproc:
        worker = await inproc_drain(args, conn, n)
    else:
        worker = await subprocess_drain(args, conn, n)
    done, first, last = await completion_window(conn, since)
    if args.inproc:
        rate = common.inproc_rate(done, worker.pop("first_call"), last)
    else:
        rate = common.window_rate(done, first, last)
    await asyncio.sleep(0.6)
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    x1 = await conn.fetchval(common.XACT_SQL)
    return {
        "xacts_per_1k_runs": round((x1 - x0) * 1000 / max(done, 1), 1),
        "submit_rate": round(submit_rate, 1),
        "drain_rate": rate or worker["polled_rate"],
        **worker,
    }


async def subprocess_drain(args: argparse.Namespace, conn: asyncpg.Connection, n: int) -> dict:
    log_path = Path(args.logdir) / f"pgqueuer_{args.workload}_worker.log"
    proc = spawn_worker(args, [], log_path)
    sampler = common.RssSampler(proc.pid).start()
    spy = common.PySpy(args.pyspy, proc.pid)
    cpu_first = common.CpuFromFirstProgress(proc.pid)
    try:
        polled = await common.drain_watch(
            lambda: remaining(conn),
            n,
            timeout=args.timeout,
            cap=args.cap,
            worker=proc,
            label="pgqueuer drain",
            on_first_progress=cpu_first,
        )
    except Exception:
        common.log(common.tail(log_path))
        raise
    finally:
        spy.stop()
        sampler.stop()
        common.stop_process(proc)
    return {
        **polled,
        "worker_peak_rss_mb": sampler.peak_mb,
        "worker_cpu_s": round(sampler.cpu_s or 0.0, 2),
        "cpu_per_run_ms": cpu_first.per_run_ms(polled, sampler.cpu_s),
    }


async def inproc_drain(args: argparse.Namespace, conn: asyncpg.Connection, n: int) -> dict:
    """The drain timed from the first handler call; CPU per run this process's CPU from
    then until the drain is seen complete."""
    probe = common.PROBE
    sampler = common.RssSampler(os.getpid(), interval=0.5).start()
    spy = common.PySpy(args.pyspy, os.getpid())
    try:
        async with InprocWorker(args) as worker:
            polled = await common.drain_watch(
                lambda: remaining(conn),
                n,
                timeout=args.timeout,
                cap=args.cap,
                poll=0.1,
                worker=worker.alive,
                label="pgqueuer drain (in-process)",
            )
            cpu = probe.cpu_since_first_call(polled["completed"])
    finally:
        spy.stop()
        sampler.stop()
    return {
        **polled,
        "first_call": probe.first_wall,
        **cpu,
        "worker_peak_rss_mb": sampler.peak_mb,
    }


async def produce(
    args: argparse.Namespace, conn: asyncpg.Connection, q: Queries, worker: Any = None
) -> float:
    """W2's producer: warm-up jobs (waited for), then ``args.runs`` single enqueues at
    ``args.rate``/s, open loop. Returns the achieved rate."""
    for i in range(common.WARMUP_RUNS):
        await q.enqueue(ENTRYPOINT, json.dumps({"w": i}).encode())
    await common.drain_watch(
        lambda: remaining(conn), common.WARMUP_RUNS, timeout=60, worker=worker, label="warm-up"
    )

    async def submit_one(i: int, t: float) -> None:
        await q.enqueue(ENTRYPOINT, json.dumps({"t": t, "i": i}).encode())

    common.log(f"producer: {args.runs} runs at {args.rate}/s")
    return await common.paced(args.runs, args.rate, submit_one)


async def latency_workload(args: argparse.Namespace, conn: asyncpg.Connection, q: Queries) -> dict:
    if args.inproc:
        return await inproc_latency_workload(args)
    lat_file = Path(args.logdir) / "pgqueuer_W2_latency.json"
    lat_file.unlink(missing_ok=True)
    log_path = Path(args.logdir) / "pgqueuer_W2_worker.log"
    proc = spawn_worker(
        args, ["--latency-file", str(lat_file), "--expect", str(args.runs)], log_path
    )
    sampler = common.RssSampler(proc.pid).start()
    try:
        achieved = await produce(args, conn, q, worker=proc)
        latencies = await common.wait_for_json(
            lat_file, worker=proc, log_path=log_path, seconds=args.timeout, label="pgqueuer"
        )
    finally:
        sampler.stop()
        common.stop_process(proc)
    return {
        **common.latency_summary(latencies),
        "submit_rate": round(achieved, 1),
        "worker_peak_rss_mb": sampler.peak_mb,
        "worker_cpu_s": round(sampler.cpu_s or 0.0, 2),
    }


async def inproc_latency_workload(args: argparse.Namespace) -> dict:
    """The worker in this process, the producer a ``produce`` subprocess."""
    sampler = common.RssSampler(os.getpid(), interval=0.5).start()
    log_path = Path(args.logdir) / "pgqueuer_W2_producer.log"
    try:
        async with InprocWorker(args) as worker:
            out = await common.run_producer(
                [
                    sys.executable,
                    __file__,
                    "produce",
                    "--dsn",
                    args.dsn,
                    "--runs",
                    str(args.runs),
                    "--rate",
                    str(args.rate),
                ],
                log_path,
            )
            await common.wait_until(
                lambda: len(worker.latencies) >= args.runs,
                seconds=args.timeout,
                alive=worker.alive,
                label="pgqueuer latency",
            )
    finally:
        sampler.stop()
    return {
        **common.latency_summary(worker.latencies),
        "submit_rate": out["submit_rate"],
        "worker_peak_rss_mb": sampler.peak_mb,
    }


async def produce_main(args: argparse.Namespace) -> None:
    conn = await asyncpg.connect(args.dsn)
    try:
        achieved = await produce(args, conn, Queries(AsyncpgDriver(conn)))
    finally:
        await conn.close()
    common.emit({"submit_rate": round(achieved, 1)})


async def run_main(args: argparse.Namespace) -> None:
    conn = await asyncpg.connect(args.dsn)
    try:
        q = await install(conn)
        if args.workload in ("W1", "W3"):
            res = await drain_workload(args, conn, q)
        elif args.workload == "W2":
            res = await latency_workload(args, conn, q)
        else:
            raise SystemExit(f"pgqueuer has no workload {args.workload}")
    finally:
        await conn.close()
    res.update(
        system="pgqueuer",
        workload=args.workload,
        runs=args.runs,
        version=PGQ_VERSION,
        variant="inproc" if args.inproc else "subprocess",
    )
    common.emit(res)


def main() -> None:
    args = common.peer_parser().parse_args()
    if args.role == "worker":
        uvloop.run(worker_main(args))
    elif args.role == "produce":
        asyncio.run(produce_main(args))
    else:
        asyncio.run(run_main(args))  # the standard loop: where --inproc hosts the worker


if __name__ == "__main__":
    main()
