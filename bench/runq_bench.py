"""runq side of the bench. Runs with the project's .venv.

    python bench/runq_bench.py run --workload W1|W2|W3|W4|mem --dsn DSN [--runs N] ...

Producer: the Python API (``Queue.open`` + ``Queue.defer_many`` for bulk, ``Queue.defer``
for W2). Worker: ONE ``runq serve`` subprocess (uvloop), ``max_concurrency = 16``, HTTP
off, the bench components from bench/bench_components.py; with ``--inproc``, the same
supervisor hosted in this process on the standard asyncio loop (W2's producer is then a
``produce`` subprocess, so the worker's loop serves the worker only). Drain is measured by
polling the count of unfinished runs, and reported over the database's completion window
(first to last ``completed_at``), like the peers; in-process, from the first handler call
to the last ``completed_at``. Peak resident memory comes from /proc (VmHWM).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

import runq
from runq import Actor, Queue
from runq.config import Config, load_config
from runq.log import configure_logging
from runq.serve.supervisor import Supervisor
from runq.store import codec as store_common

ROOT = common.BENCH_DIR.parent
RUNQ_BIN = str(Path(sys.executable).parent / "runq")
SCHEMA = "runq"
OTHER_DEPLOYMENT = "other-service"


#: The handlers runq_bench's runs use (bench_components, on PYTHONPATH).
COMPONENTS = {
    "task/noop": "bench_components:noop",
    "task/record": "bench_components:record_start",
    "task/emit10": "bench_components:emit_ten",
    "task/step1": "bench_components:one_step",
}


def write_config(path: Path, *, url: str, concurrency: int) -> None:
    queue = {"max_concurrency": concurrency, "max_queue_depth": 0}
    path.write_text(common.runq_config_text(url, queue=queue, components=COMPONENTS))


class Target:
    """Where the runs live: counts and the completion window, on PostgreSQL or SQLite."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sqlite = url.startswith("sqlite")
        self.table = f"{SCHEMA}_runs" if self.sqlite else f"{SCHEMA}.runs"
        self._pg: asyncpg.Connection | None = None
        self._lite: sqlite3.Connection | None = None

    async def open(self) -> None:
        if self.sqlite:
            self._lite = sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=30)
        else:
            self._pg = await asyncpg.connect(self.url)

    async def close(self) -> None:
        if self._pg is not None:
            await self._pg.close()
        if self._lite is not None:
            self._lite.close()

    async def val(self, sql: str, *args: Any) -> Any:
        if self._lite is not None:
            return self._lite.execute(sql.replace("$1", "?").replace("$2", "?"), args).fetchone()[0]
        assert self._pg is not None
        return await self._pg.fetchval(sql, *args)

    async def row(self, sql: str, *args: Any) -> tuple[Any, ...]:
        if self._lite is not None:
            return tuple(
                self._lite.execute(sql.replace("$1", "?").replace("$2", "?"), args).fetchone()
            )
        assert self._pg is not None
        return tuple(await self._pg.fetchrow(sql, *args))

    async def remaining(self, component: str) -> int:
        # One count per status, so each can walk its partial index (runs_claim_idx from the
        # deployment prefix, runs_lease_idx): a status IN (...) count walked every queued
        # run, W3's 200,000 of another deployment included, ten times a second, and the
        # drain paid for the bench's polling (PgQueuer's poll uses its partial indexes too).
        t = self.table
        return int(
            await self.val(
                f"SELECT (SELECT count(*) FROM {t} WHERE status = 'queued' "
                "AND deployment_id = '' AND component_id = $1) + "
                f"(SELECT count(*) FROM {t} WHERE status = 'running' "
                "AND deployment_id = '' AND component_id = $2)",
                component,
                component,
            )
        )

    async def xacts(self) -> int | None:
        if self._pg is None:
            return None
        await self._pg.execute("SELECT pg_stat_clear_snapshot()")
        return int(await self._pg.fetchval(common.XACT_SQL))

    async def max_in_flight(self, since: float) -> int:
        """The most measured runs that were claimed and not yet completed at one instant
        (from started_at/completed_at): what the worker really ran at once, to hold
        against its max_concurrency."""
        return int(
            await self.val(
                f"""SELECT coalesce(max(c), 0) FROM (
                    SELECT sum(d) OVER (ORDER BY t, d ROWS UNBOUNDED PRECEDING) AS c FROM (
                        SELECT started_at AS t, 1 AS d FROM {self.table}
                        WHERE deployment_id = '' AND completed_at > $1
                        UNION ALL
                        SELECT completed_at, -1 FROM {self.table}
                        WHERE deployment_id = '' AND completed_at > $2) AS e) AS x""",
                since,
                since,
            )
        )

    async def tenths(self, since: float) -> dict[str, Any]:
        """The drain rate of each tenth of the measured runs, in completion order (W1cold:
        does the drain slow down as the table grows under plans made on an empty one?)."""
        stamps = [
            float(r[0])
            for r in await self.rows(
                f"SELECT completed_at FROM {self.table} WHERE status = 'completed' "
                "AND deployment_id = '' AND completed_at > $1 ORDER BY completed_at",
                since,
            )
        ]
        return common.tenth_rates(stamps)

    async def rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        if self._lite is not None:
            return [tuple(r) for r in self._lite.execute(sql.replace("$1", "?"), args)]
        assert self._pg is not None
        return [tuple(r) for r in await self._pg.fetch(sql, *args)]

    async def autovacuum_off(self) -> list[str]:
        """``autovacuum_enabled = false`` on every table of runq's schema (the tables' own
        storage parameter: the server's settings stay as they are), so no auto-analyze
        replaces the plans the worker makes on the empty table."""
        assert self._pg is not None
        tables = [
            r["tablename"]
            for r in await self._pg.fetch(
                "SELECT tablename FROM pg_tables WHERE schemaname = $1", SCHEMA
            )
        ]
        for t in tables:
            await self._pg.execute(f'ALTER TABLE {SCHEMA}."{t}" SET (autovacuum_enabled = false)')
        return tables

    async def window(self, since: float) -> tuple[int, float | None, float | None]:
        n, a, b = await self.row(
            f"SELECT count(*), min(completed_at), max(completed_at) FROM {self.table} "
            "WHERE status = 'completed' AND deployment_id = '' AND completed_at > $1",
            since,
        )
        return int(n), a, b


def serve(cfg: Path, log_path: Path, env: dict[str, str]) -> subprocess.Popen[Any]:
    return common.start_process(
        [RUNQ_BIN, "serve", "--config", str(cfg), "--log-format", "json"],
        env=env,
        log_path=log_path,
    )


async def bulk_submit(q: Queue, component: str, n: int, batch: int) -> float:
    t0 = time.perf_counter()
    for start in range(0, n, batch):
        k = min(batch, n - start)
        # The public bulk path: idempotency, depth gates, sealing and one wake-up included.
        await q.defer_many([q.new_run("task", component, {"i": start + j}) for j in range(k)])
    return n / (time.perf_counter() - t0)


async def prefill(target: Target, final: int, foreign: int) -> None:
    """200,000 final runs (completed an hour ago, inside retention) and 200,000 queued runs
    of another deployment, which this worker (deployment none) never claims."""
    assert target._pg is not None
    actor = store_common.encode_actor(Actor())
    cols = (
        "id, component_type, component_id, status, attempt, max_attempts, priority, actor, "
        "deployment_id, origin, created_at, updated_at, available_at, started_at, "
        "completed_at, termination_reason, has_request"
    )
    now = "extract(epoch from now())::float8"
    await target._pg.execute(
        f"""INSERT INTO {target.table} ({cols})
            SELECT '00000000-0000-7000-8000-' || lpad(g::text, 12, '0'), 'task', 'noop',
                   'completed', 1, 1, 0, $2, '', 'python', {now} - 3700, {now} - 3600,
                   {now} - 3700, {now} - 3600, {now} - 3600, 'completed', true
            FROM generate_series(1, $1) g""",
        final,
        actor,
    )
    await target._pg.execute(
        f"""INSERT INTO {target.table} ({cols})
            SELECT '00000000-0000-7000-9000-' || lpad(g::text, 12, '0'), 'task', 'noop',
                   'queued', 0, 1, 0, $2, $3, 'python', {now} - 60, {now} - 60,
                   {now} - 60, NULL, NULL, NULL, true
            FROM generate_series(1, $1) g""",
        foreign,
        actor,
        OTHER_DEPLOYMENT,
    )
    await target._pg.execute(f"VACUUM ANALYZE {target.table}")


#: W1cold's warm-up: rounds of runs drained one after the other before the measured runs
#: arrive, so every connection of the worker's pool has run its statements on a table of
#: at most a few dozen rows (one or two pages, never analyzed).
COLD_ROUNDS = 3


async def cold_warm_up(q: Queue, target: Target, worker: Any, concurrency: int) -> None:
    per_round = 2 * concurrency
    for r in range(COLD_ROUNDS):
        await bulk_submit(q, "noop", per_round, per_round)
        await common.drain_watch(
            lambda: target.remaining("noop"),
            per_round,
            timeout=120,
            poll=0.05,
            worker=worker,
            label=f"cold warm-up {r + 1}",
        )


@asynccontextmanager
async def inproc_worker(config: Config) -> AsyncIterator[Supervisor]:
    """``runq serve`` without the process: the supervisor on its own ``Queue`` (its own
    pool, as a serving process has), hosted on this process's standard asyncio loop, and
    drained like a SIGTERM drains it when the block ends."""
    async with Queue.open(config=config, migrate=False) as worker_queue:
        supervisor = Supervisor(worker_queue)
        async with anyio.create_task_group() as tg:
            tg.start_soon(supervisor.run)
            try:
                yield supervisor
            finally:
                supervisor.request_stop()


BeforeDrain = Callable[[Any], Awaitable[None]]


async def inproc_drain(
    args: argparse.Namespace,
    config: Config,
    target: Target,
    n: int,
    before_drain: BeforeDrain | None = None,
) -> dict[str, Any]:
    """W1/W3/W4 with the worker in this process: drain timed from the first handler call
    to the last completion committed, CPU per run this process's CPU across it.
    ``before_drain(None)`` runs once the worker is up (W1cold: warm-up, then the submit)."""
    probe = common.PROBE
    sampler = common.RssSampler(os.getpid(), interval=0.5).start()
    spy = common.PySpy(args.pyspy, os.getpid())
    try:
        # A supervisor that fails cancels this block through its task group.
        async with inproc_worker(config):
            if before_drain is not None:
                await before_drain(None)
                probe.first_wall = probe.first_cpu = probe.first_times = None
                probe.calls = 0
            polled = await common.drain_watch(
                lambda: target.remaining(args.component),
                n,
                timeout=args.timeout,
                poll=0.1,
                label="runq drain (in-process)",
            )
            cpu = probe.cpu_since_first_call(n)
    finally:
        spy.stop()
        sampler.stop()
    return {
        **polled,
        "first_call": probe.first_wall,
        **cpu,
        "worker_peak_rss_mb": sampler.peak_mb,
        "worker_exit": 0,
    }


async def subprocess_drain(
    args: argparse.Namespace,
    cfg: Path,
    env: dict[str, str],
    target: Target,
    n: int,
    before_drain: BeforeDrain | None = None,
) -> tuple[dict[str, Any], list[int], int]:
    log_path = Path(args.logdir) / f"runq_{args.workload}_worker.log"
    proc = serve(cfg, log_path, env)
    if before_drain is not None:
        try:
            await before_drain(proc)
        except BaseException:
            common.log(common.tail(log_path))
            common.stop_process(proc)
            raise
    sampler = common.RssSampler(proc.pid).start()
    spy = common.PySpy(args.pyspy, proc.pid)
    cpu_first = common.CpuFromFirstProgress(proc.pid)
    early_kb: list[int] = []

    async def remaining() -> int:
        left = await target.remaining(args.component)
        if not early_kb and n - left >= common.MEM_EARLY:
            early_kb.append(sampler.sample())
        return left

    try:
        polled = await common.drain_watch(
            remaining,
            n,
            timeout=args.timeout,
            worker=proc,
            label="runq drain",
            on_first_progress=cpu_first,
        )
        end_kb = sampler.sample()
    except Exception:
        common.log(common.tail(log_path))
        raise
    finally:
        spy.stop()
        sampler.stop()
        code = common.stop_process(proc)
    res = {
        **polled,
        "worker_peak_rss_mb": sampler.peak_mb,
        "worker_cpu_s": round(sampler.cpu_s or 0.0, 2),
        "cpu_per_run_ms": cpu_first.per_run_ms(polled, sampler.cpu_s),
        "worker_exit": code,
    }
    return res, early_kb, end_kb


async def drain_workload(
    args: argparse.Namespace, cfg: Path, env: dict[str, str]
) -> dict[str, Any]:
    n = args.runs
    config = load_config(cfg, environ=env)
    target = Target(config.store.url)
    cold = args.workload == "W1cold"
    async with Queue.open(config=config) as q:
        await target.open()
        try:
            if args.workload == "W3":
                common.log(f"prefill {args.final} final + {args.foreign} foreign")
                await prefill(target, args.final, args.foreign)
            before: BeforeDrain | None = None
            submitted: dict[str, float] = {}
            if cold:
                tables = await target.autovacuum_off()
                common.log(f"autovacuum_enabled = false on {len(tables)} tables of {SCHEMA}")

                async def before(worker: Any) -> None:
                    # The worker's pool meets an empty table: its claims, completions and
                    # the rest are prepared (generic plans) on it, then the runs arrive.
                    await cold_warm_up(q, target, worker, args.concurrency)
                    submitted["since"] = await q.store.now()
                    common.log(f"bulk submit {n} with the worker running")
                    submitted["rate"] = await bulk_submit(q, args.component, n, args.batch)

            else:
                common.log(f"bulk submit {n}")
                submitted["rate"] = await bulk_submit(q, args.component, n, args.batch)
                submitted["since"] = await q.store.now()
            x0 = await target.xacts()
            early_kb: list[int] = []
            end_kb = 0
            if args.inproc:
                worker = await inproc_drain(args, config, target, n, before)
            else:
                worker, early_kb, end_kb = await subprocess_drain(args, cfg, env, target, n, before)
            since, submit_rate = submitted["since"], submitted["rate"]
            done, first, last = await target.window(since)
            tenths = await target.tenths(since)
            in_flight = await target.max_in_flight(since)
            await asyncio.sleep(0.6)
            x1 = await target.xacts()
        finally:
            await target.close()
    if args.inproc and not cold:
        rate = common.inproc_rate(done, worker.pop("first_call"), last)
    else:
        # W1cold: the runs arrive while the worker runs, so the window is the database's.
        worker.pop("first_call", None)
        rate = common.window_rate(done, first, last)
    res: dict[str, Any] = {
        "submit_rate": round(submit_rate, 1),
        "drain_rate": rate or worker["polled_rate"],
        **worker,
        "max_in_flight": in_flight,
        **tenths,
    }
    if x0 is not None and x1 is not None:
        res["xacts_per_1k_runs"] = round((x1 - x0) * 1000 / max(done, 1), 1)
    if args.workload == "mem":
        res["rss_after_1000_mb"] = round(early_kb[0] / 1024, 1) if early_kb else None
        res["rss_end_mb"] = round(end_kb / 1024, 1)
        if early_kb:
            res["rss_growth"] = round(end_kb / early_kb[0], 3)
    return res


async def produce_and_measure(
    args: argparse.Namespace, q: Queue, target: Target, worker: Any = None
) -> dict[str, Any]:
    """W2's producer: warm-up runs, then ``args.runs`` single submits at ``args.rate``/s
    (open loop); waits for them to finish and returns their start latencies (handler start
    minus the producer's clock before the submit call, from the stored answers)."""
    for i in range(common.WARMUP_RUNS):
        await q.defer("task", "noop", {"w": i})
    await common.drain_watch(
        lambda: target.remaining("noop"),
        common.WARMUP_RUNS,
        timeout=60,
        worker=worker,
        label="warm-up",
    )
    ids: list[str] = []

    async def submit_one(i: int, t: float) -> None:
        result = await q.defer("task", "record", {"t": t, "i": i})
        ids.append(result.run.id)

    common.log(f"producer: {args.runs} runs at {args.rate}/s")
    achieved = await common.paced(args.runs, args.rate, submit_one)
    await common.drain_watch(
        lambda: target.remaining("record"),
        args.runs,
        timeout=args.timeout,
        worker=worker,
        label="latency",
    )
    latencies = []
    for run_id in ids:
        run = await q.store.get(run_id)
        assert run is not None, run_id
        assert isinstance(run.answer, dict), run
        latencies.append(run.answer["started"] - run.answer["t"])
    return {**common.latency_summary(latencies), "submit_rate": round(achieved, 1)}


async def latency_workload(
    args: argparse.Namespace, cfg: Path, env: dict[str, str]
) -> dict[str, Any]:
    config = load_config(cfg, environ=env)
    target = Target(config.store.url)
    log_path = Path(args.logdir) / "runq_W2_worker.log"
    async with Queue.open(config=config) as q:
        await target.open()
        proc = serve(cfg, log_path, env)
        sampler = common.RssSampler(proc.pid).start()
        try:
            res = await produce_and_measure(args, q, target, worker=proc)
        except Exception:
            common.log(common.tail(log_path))
            raise
        finally:
            sampler.stop()
            common.stop_process(proc)
            await target.close()
    return {
        **res,
        "worker_peak_rss_mb": sampler.peak_mb,
        "worker_cpu_s": round(sampler.cpu_s or 0.0, 2),
    }


async def inproc_latency_workload(
    args: argparse.Namespace, cfg: Path, env: dict[str, str]
) -> dict[str, Any]:
    """W2 with the worker in this process and the producer a ``produce`` subprocess, so
    the producer neither shares the worker's loop nor wakes it through this process."""
    config = load_config(cfg, environ=env)
    async with Queue.open(config=config):  # migrated before the worker starts
        pass
    sampler = common.RssSampler(os.getpid(), interval=0.5).start()
    cmd = [sys.executable, __file__, "produce", "--config", str(cfg), "--runs", str(args.runs)]
    cmd += ["--rate", str(args.rate), "--timeout", str(args.timeout)]
    try:
        async with inproc_worker(config):
            res = await common.run_producer(cmd, Path(args.logdir) / "runq_W2_producer.log")
    finally:
        sampler.stop()
    res["worker_peak_rss_mb"] = sampler.peak_mb
    return res


async def produce_main(args: argparse.Namespace) -> None:
    config = load_config(Path(args.config))
    target = Target(config.store.url)
    async with Queue.open(config=config, migrate=False) as q:
        await target.open()
        try:
            res = await produce_and_measure(args, q, target)
        finally:
            await target.close()
    common.emit(res)


async def run_main(args: argparse.Namespace) -> None:
    if args.component == "step1" and not hasattr(runq.RunContext, "step"):
        common.emit({"skipped": "runq.RunContext has no step() yet (recorded steps, issue 26)"})
        return
    workdir = Path(args.logdir) / f"runq_{args.workload}"
    workdir.mkdir(parents=True, exist_ok=True)
    if args.workload == "W4":
        db = workdir / "bench.db"
        for p in workdir.glob("bench.db*"):
            p.unlink()
        url = f"sqlite:///{db}"
    else:
        url = args.dsn
    cfg = workdir / "runq.toml"
    write_config(cfg, url=url, concurrency=args.concurrency)
    env = common.runq_env(common.new_seal_key())
    os.environ.update({"RUNQ_SEAL_KEY": env["RUNQ_SEAL_KEY"]})
    if args.inproc:
        configure_logging("json", level=logging.INFO)  # as `runq serve --log-format json`
    if args.workload == "W2":
        measure = inproc_latency_workload if args.inproc else latency_workload
        res = await measure(args, cfg, env)
    else:
        res = await drain_workload(args, cfg, env)
    res.update(
        system="runq",
        workload=args.workload,
        runs=args.runs,
        engine="sqlite" if args.workload == "W4" else "postgres",
        variant="inproc" if args.inproc else "subprocess",
        version=getattr(runq, "__version__", "0.1.0"),
        component=args.component,
    )
    common.emit(res)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["run", "produce"])
    p.add_argument("--config", default="", help="produce: the runq.toml of the run")
    p.add_argument(
        "--inproc",
        action="store_true",
        help="host the worker (its supervisor) in this process on the standard asyncio loop",
    )
    p.add_argument("--dsn", default="")
    p.add_argument("--workload", default="W1", choices=["W1", "W2", "W3", "W4", "mem", "W1cold"])
    p.add_argument(
        "--component",
        default="noop",
        choices=["noop", "emit10", "step1"],
        help="the handler of the drained runs: a no-op, 10 ctx.emit events, or one ctx.step",
    )
    p.add_argument("--runs", type=int, default=common.W1_RUNS)
    p.add_argument("--final", type=int, default=common.W3_FINAL)
    p.add_argument("--foreign", type=int, default=common.W3_FOREIGN)
    p.add_argument("--rate", type=float, default=common.W2_RATE)
    p.add_argument("--batch", type=int, default=common.SUBMIT_BATCH)
    p.add_argument("--concurrency", type=int, default=common.CONCURRENCY)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--cap", type=float, default=None, help="unused for runq (always drains fully)")
    p.add_argument("--logdir", default="/tmp")
    p.add_argument(
        "--pyspy",
        default=None,
        help="profile the worker into this file (.txt raw, .json speedscope, .svg)",
    )
    args = p.parse_args()
    # asyncio.run: the standard loop, as the in-process variant requires (runq serve, the
    # subprocess variant, picks uvloop itself).
    asyncio.run(produce_main(args) if args.role == "produce" else run_main(args))


if __name__ == "__main__":
    main()
