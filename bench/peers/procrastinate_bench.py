"""Procrastinate side of the bench. Runs in bench/.peers/venv (never runq's environment).

    python procrastinate_bench.py run --workload W1|W2|W3 --dsn DSN [--runs N] ...
    python procrastinate_bench.py worker --dsn DSN [--latency-file F --expect N]

The worker is what ``procrastinate worker`` runs: ``App(PsycopgConnector)``,
``run_worker_async(queues=[...], concurrency=16)`` with LISTEN/NOTIFY (the default) and
the default ``delete_jobs="never"`` (finished jobs stay in procrastinate_jobs). With
``--inproc`` the same worker runs as a task of the driver on the standard asyncio loop
(W2's producer is then a ``produce`` subprocess).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import procrastinate
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import contextlib

import common

QUEUE = "bench"
OTHER = "other_service"

app = procrastinate.App(connector=procrastinate.PsycopgConnector())
_latency: dict[str, Any] = {"file": "", "expect": 0, "values": [], "written": False}
_hit = common.PROBE.hit


@app.task(name="noop", queue=QUEUE)
async def noop(i: int = 0, t: float | None = None, w: int | None = None) -> None:
    _hit()
    if t is not None:
        values = _latency["values"]
        values.append(time.time() - t)
        if _latency["file"] and len(values) >= _latency["expect"] and not _latency["written"]:
            _latency["written"] = True
            common.write_json_atomically(_latency["file"], values)


def connector(dsn: str) -> procrastinate.PsycopgConnector:
    return procrastinate.PsycopgConnector(conninfo=dsn)


async def worker_main(args: argparse.Namespace) -> None:
    _latency.update(file=args.latency_file, expect=args.expect)
    with app.replace_connector(connector(args.dsn)):
        async with app.open_async():
            await app.run_worker_async(queues=[QUEUE], concurrency=args.concurrency)


# -- driver ---------------------------------------------------------------------------------


async def remaining(conn: psycopg.AsyncConnection) -> int:
    cur = await conn.execute(
        "SELECT count(*) FROM procrastinate_jobs "
        "WHERE queue_name = %s AND status IN ('todo', 'doing')",
        (QUEUE,),
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def bulk_submit(n: int, batch: int) -> float:
    t0 = time.perf_counter()
    for start in range(0, n, batch):
        k = min(batch, n - start)
        await noop.batch_defer_async(*({"i": start + j} for j in range(k)))
    return n / (time.perf_counter() - t0)


async def prefill(conn: psycopg.AsyncConnection, final: int, foreign: int) -> None:
    """Procrastinate keeps finished jobs in procrastinate_jobs (delete_jobs='never'):
    'final runs' are succeeded jobs of the served queue; 'runs the worker does not serve'
    are todo jobs of a queue the worker does not listen to."""
    await conn.execute(
        """INSERT INTO procrastinate_jobs (queue_name, task_name, args, status, attempts)
           SELECT %s, 'noop', jsonb_build_object('i', g), 'succeeded', 1
           FROM generate_series(1, %s) g""",
        (QUEUE, final),
    )
    await conn.execute(
        """INSERT INTO procrastinate_jobs (queue_name, task_name, args, status)
           SELECT %s, 'noop', jsonb_build_object('i', g), 'todo'
           FROM generate_series(1, %s) g""",
        (OTHER, foreign),
    )
    await conn.execute("VACUUM ANALYZE procrastinate_jobs")
    await conn.execute("VACUUM ANALYZE procrastinate_events")


async def completion_window(
    conn: psycopg.AsyncConnection, since: float
) -> tuple[int, float | None, float | None]:
    cur = await conn.execute(
        """SELECT count(*), extract(epoch FROM min(e.at))::float8,
                  extract(epoch FROM max(e.at))::float8
           FROM procrastinate_events e
           WHERE e.type = 'succeeded' AND e.at > to_timestamp(%s)""",
        (since,),
    )
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), row[1], row[2]


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


async def xacts(conn: psycopg.AsyncConnection) -> int:
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    cur = await conn.execute(common.XACT_SQL)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def now_epoch(conn: psycopg.AsyncConnection) -> float:
    cur = await conn.execute("SELECT extract(epoch FROM now())::float8")
    row = await cur.fetchone()
    assert row is not None
    return float(row[0])


async def drain_workload(args: argparse.Namespace, conn: psycopg.AsyncConnection) -> dict[str, Any]:
    n = args.runs
    if args.workload == "W3":
        common.log(f"prefill {args.final} final + {args.foreign} foreign")
        await prefill(conn, args.final, args.foreign)
    common.log(f"bulk submit {n}")
    submit_rate = await bulk_submit(n, args.batch)
    since = await now_epoch(conn)
    x0 = await xacts(conn)
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
    x1 = await xacts(conn)
    return {
        "submit_rate": round(submit_rate, 1),
        "drain_rate": rate or worker["polled_rate"],
        **worker,
        "xacts_per_1k_runs": round((x1 - x0) * 1000 / max(done, 1), 1),
    }


async def subprocess_drain(
    args: argparse.Namespace, conn: psycopg.AsyncConnection, n: int
) -> dict[str, Any]:
    log_path = Path(args.logdir) / f"procrastinate_{args.workload}_worker.log"
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
            label="procrastinate drain",
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


class InprocWorker:
    """``run_worker_async`` as a task of this process (standard asyncio loop), stopped
    the way Procrastinate documents: cancelling it lets running jobs finish."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    async def __aenter__(self) -> InprocWorker:
        self.task = asyncio.create_task(
            app.run_worker_async(
                queues=[QUEUE], concurrency=self.args.concurrency, install_signal_handlers=False
            )
        )
        self.alive = common.TaskAlive(self.task)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self.task, 30)


async def inproc_drain(
    args: argparse.Namespace, conn: psycopg.AsyncConnection, n: int
) -> dict[str, Any]:
    """The drain timed from the first handler call; CPU per run this process's CPU from
    then until the drain is seen complete (or the cap)."""
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
                label="procrastinate drain (in-process)",
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
    args: argparse.Namespace, conn: psycopg.AsyncConnection, worker: Any = None
) -> float:
    """W2's producer: warm-up jobs (waited for), then ``args.runs`` single defers at
    ``args.rate``/s, open loop. Returns the achieved rate."""
    for i in range(common.WARMUP_RUNS):
        await noop.defer_async(w=i)
    await common.drain_watch(
        lambda: remaining(conn), common.WARMUP_RUNS, timeout=60, worker=worker, label="warm-up"
    )

    async def submit_one(i: int, t: float) -> None:
        await noop.defer_async(i=i, t=t)

    common.log(f"producer: {args.runs} runs at {args.rate}/s")
    return await common.paced(args.runs, args.rate, submit_one)


async def latency_workload(
    args: argparse.Namespace, conn: psycopg.AsyncConnection
) -> dict[str, Any]:
    if args.inproc:
        return await inproc_latency_workload(args)
    lat_file = Path(args.logdir) / "procrastinate_W2_latency.json"
    lat_file.unlink(missing_ok=True)
    log_path = Path(args.logdir) / "procrastinate_W2_worker.log"
    proc = spawn_worker(
        args, ["--latency-file", str(lat_file), "--expect", str(args.runs)], log_path
    )
    sampler = common.RssSampler(proc.pid).start()
    try:
        achieved = await produce(args, conn, worker=proc)
        latencies = await common.wait_for_json(
            lat_file, worker=proc, log_path=log_path, seconds=args.timeout, label="procrastinate"
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


async def inproc_latency_workload(args: argparse.Namespace) -> dict[str, Any]:
    """The worker in this process, the producer a ``produce`` subprocess."""
    sampler = common.RssSampler(os.getpid(), interval=0.5).start()
    cmd = [sys.executable, __file__, "produce", "--dsn", args.dsn, "--runs", str(args.runs)]
    cmd += ["--rate", str(args.rate)]
    values: list[float] = _latency["values"]
    try:
        async with InprocWorker(args) as worker:
            out = await common.run_producer(
                cmd, Path(args.logdir) / "procrastinate_W2_producer.log"
            )
            await common.wait_until(
                lambda: len(values) >= args.runs,
                seconds=args.timeout,
                alive=worker.alive,
                label="procrastinate latency",
            )
    finally:
        sampler.stop()
    return {
        **common.latency_summary(values),
        "submit_rate": out["submit_rate"],
        "worker_peak_rss_mb": sampler.peak_mb,
    }


async def produce_main(args: argparse.Namespace) -> None:
    with app.replace_connector(connector(args.dsn)):
        async with (
            app.open_async(),
            await psycopg.AsyncConnection.connect(args.dsn, autocommit=True) as conn,
        ):
            achieved = await produce(args, conn)
    common.emit({"submit_rate": round(achieved, 1)})


async def run_main(args: argparse.Namespace) -> None:
    with app.replace_connector(connector(args.dsn)):
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            async with await psycopg.AsyncConnection.connect(args.dsn, autocommit=True) as conn:
                if args.workload in ("W1", "W3"):
                    res = await drain_workload(args, conn)
                elif args.workload == "W2":
                    res = await latency_workload(args, conn)
                else:
                    raise SystemExit(f"procrastinate has no workload {args.workload}")
    res.update(
        system="procrastinate",
        workload=args.workload,
        runs=args.runs,
        version=procrastinate.__version__,
        variant="inproc" if args.inproc else "subprocess",
    )
    common.emit(res)


def main() -> None:
    args = common.peer_parser().parse_args()
    if args.role == "worker":
        asyncio.run(worker_main(args))
    elif args.role == "produce":
        asyncio.run(produce_main(args))
    else:
        asyncio.run(run_main(args))


if __name__ == "__main__":
    main()
