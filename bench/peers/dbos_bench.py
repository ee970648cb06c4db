"""DBOS Transact's side of W6 (run in bench/.peers/dbos-venv, never a dependency of runq).

    bench/.peers/dbos-venv/bin/python bench/peers/dbos_bench.py w1 --dsn DSN [--runs 20000]
        [--steps-per-run 0] [--concurrency 16] [--poll 0.01]
    ... dbos_bench.py steps --dsn DSN [--steps 100] [--runs 20]
    ... dbos_bench.py recovery --dsn DSN [--recorded 1000]

Used as DBOS's documentation shows: ``DBOS(config=...)`` then ``DBOS.launch()``, workflows
and steps as decorated ``async def`` functions (the asyncio flavour, like runq's async
handlers), queues registered in the system database (``DBOS.register_queue`` /
``DBOSClient.register_queue``), enqueued from outside the application with ``DBOSClient``.
Logging at WARNING (runq logs per-run lines at DEBUG). Every role runs on the standard
asyncio loop, on a database of its own that bench/run.py creates (DBOS's system schema
``dbos`` is migrated into it with ``DBOS.migrate``).

- ``w1``: W1 for DBOS. ``--runs`` workflows enqueued on a queue with
  ``worker_concurrency = --concurrency`` through ``DBOSClient.enqueue_in_transaction``
  in transactions of ``--batch`` (DBOS's closest to a bulk enqueue; submit rate
  reported), then DBOS is launched in this process and drains them. A workflow is a
  no-op, or makes ``--steps-per-run`` no-op steps. DBOS's queues poll (no wake-up): the
  default ``polling_interval_sec = 1.0`` would cap 16 slots at 16 workflows a second, so
  the queue polls every ``--poll`` seconds (0.01). Drain = completed workflows / (last
  completion - first workflow call), CPU per run this process's CPU from that first call,
  as runq's in-process W1.
- ``steps``: per-step overhead. ``--runs`` workflows, one after the other, each calling
  ``--steps`` no-op steps; the time from before the first step to after the last, per
  step; median over the workflows.
- ``recovery``: a workflow of ``--recorded`` + 10 steps whose process is SIGKILLed inside
  step ``--recorded`` (so that many are recorded), then the process is started again
  (``DBOS.launch()`` recovers the pending workflows of its executor). Reported: ``replay_s``
  (the recovered workflow's entry to its first new step: replaying the recorded steps)
  and ``restart_s`` (the new process's start to that step: interpreter, launch, DBOS's
  recovery hand-off through its internal queue, replay).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import common
import psycopg
from dbos import DBOS, DBOSClient, DBOSConfig

APP = "runq-bench"
VERSION = "bench"
QUEUE = "w1"
PROBE = common.PROBE

# -- workflows and steps (registered at import, as DBOS requires, before launch) ----------


@DBOS.step()
async def nothing() -> None:
    return None


@DBOS.workflow(name="noop")
async def noop_workflow(i: int, steps: int) -> None:
    PROBE.hit()
    for _ in range(steps):
        await nothing()


@DBOS.workflow(name="many_steps")
async def many_steps(steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        await nothing()
    return (time.perf_counter() - t0) / steps


#: The recovery workflow's marks: a file the parent reads (times on this machine's clock).
MARKS = os.environ.get("RUNQ_BENCH_DBOS_MARKS", "")


def mark(name: str, value: float) -> None:
    with open(MARKS, "a") as f:
        f.write(json.dumps({name: value}) + "\n")


@DBOS.step()
async def recovery_step(i: int, kill_at: int) -> None:
    if i == kill_at:
        marks = read_marks(MARKS)
        if "killed" not in marks:
            mark("killed", time.time())
            os.kill(os.getpid(), signal.SIGKILL)
        mark("first_new", time.time())


@DBOS.workflow(name="recovery")
async def recovery_workflow(total: int, kill_at: int) -> None:
    mark("entry", time.time())
    for i in range(total):
        await recovery_step(i, kill_at)


def read_marks(path: str) -> dict[str, float]:
    """The marks so far; for a repeated name (``entry``), the last one."""
    out: dict[str, float] = {}
    if Path(path).exists():
        for line in Path(path).read_text().splitlines():
            out.update(json.loads(line))
    return out


# -- setup -----------------------------------------------------------------------------------


def dbos_config(dsn: str) -> DBOSConfig:
    return {
        "name": APP,
        "system_database_url": dsn,
        "application_version": VERSION,
        "log_level": "WARNING",
    }


def launch(dsn: str) -> None:
    DBOS(config=dbos_config(dsn))
    DBOS.launch()


async def unfinished(conn: psycopg.AsyncConnection[Any]) -> int:
    cur = await conn.execute(
        "SELECT count(*) FROM dbos.workflow_status "
        "WHERE queue_name = %s AND status IN ('ENQUEUED', 'PENDING')",
        (QUEUE,),
    )
    row = await cur.fetchone()
    return int(row[0]) if row else 0


def enqueue_all(dsn: str, n: int, batch: int, steps: int, concurrency: int, poll: float) -> float:
    """Register the queue and enqueue ``n`` workflows from a client; the submit rate."""
    import sqlalchemy as sa

    DBOS.migrate(dsn)
    client = DBOSClient(system_database_url=dsn, application_name=APP)
    client.register_queue(QUEUE, worker_concurrency=concurrency, polling_interval_sec=poll)
    engine = sa.create_engine(sa.make_url(dsn).set(drivername="postgresql+psycopg"))
    options: Any = {"queue_name": QUEUE, "workflow_name": "noop", "app_version": VERSION}
    t0 = time.perf_counter()
    try:
        for start in range(0, n, batch):
            with engine.begin() as conn:
                for i in range(start, min(n, start + batch)):
                    client.enqueue_in_transaction(conn, options, i, steps)
    finally:
        engine.dispose()
        client.destroy()
    return n / (time.perf_counter() - t0)


# -- roles -----------------------------------------------------------------------------------


async def w1(args: argparse.Namespace) -> dict[str, Any]:
    common.log(f"enqueue {args.runs} workflows ({args.steps_per_run} steps each)")
    submit_rate = await asyncio.to_thread(
        enqueue_all,
        args.dsn,
        args.runs,
        args.batch,
        args.steps_per_run,
        args.concurrency,
        args.poll,
    )
    conn = await psycopg.AsyncConnection.connect(args.dsn, autocommit=True)
    sampler = common.RssSampler(os.getpid(), interval=0.5).start()
    spy = common.PySpy(args.pyspy, os.getpid())
    try:
        launch(args.dsn)
        polled = await common.drain_watch(
            lambda: unfinished(conn),
            args.runs,
            timeout=args.timeout,
            cap=args.cap,
            poll=0.1,
            label="dbos drain",
        )
        cpu = PROBE.cpu_since_first_call(polled["completed"])
        cur = await conn.execute(
            "SELECT count(*), max(updated_at) FROM dbos.workflow_status "
            "WHERE queue_name = %s AND status = 'SUCCESS'",
            (QUEUE,),
        )
        row = await cur.fetchone()
        assert row is not None
        done, last_ms = int(row[0]), row[1]
    finally:
        spy.stop()
        sampler.stop()
        DBOS.destroy()
        await conn.close()
    last = last_ms / 1000 if last_ms is not None else None
    rate = common.inproc_rate(done, PROBE.first_wall, last)
    return {
        "submit_rate": round(submit_rate, 1),
        "drain_rate": rate or polled["polled_rate"],
        **polled,
        **cpu,
        "worker_peak_rss_mb": sampler.peak_mb,
        "steps_per_run": args.steps_per_run,
        "poll_s": args.poll,
    }


async def steps(args: argparse.Namespace) -> dict[str, Any]:
    await asyncio.to_thread(DBOS.migrate, args.dsn)
    launch(args.dsn)
    try:
        per_step = [await many_steps(args.steps) for _ in range(args.runs)]
    finally:
        DBOS.destroy()
    summary = common.step_summary([x * 1000 for x in per_step])
    return {**summary, "steps": args.steps, "workflows": args.runs}


def recovery_child(args: argparse.Namespace) -> None:
    """One life of the recovery workflow's process: the first starts the workflow (and
    dies in its step ``--recorded``), the second recovers it and waits for its end."""
    mark(f"process_start_{args.phase}", float(args.started))
    DBOS.migrate(args.dsn)
    launch(args.dsn)
    total = args.recorded + 10

    async def first() -> None:
        await recovery_workflow(total, args.recorded)

    async def second() -> None:
        deadline = time.monotonic() + args.timeout
        while "first_new" not in read_marks(MARKS):
            if time.monotonic() > deadline:
                raise TimeoutError("the recovered workflow never reached its next step")
            await asyncio.sleep(0.01)
        handle = await DBOS.retrieve_workflow_async(args.workflow_id)
        await handle.get_result()

    try:
        if args.phase == "1":
            from dbos import SetWorkflowID

            with SetWorkflowID(args.workflow_id):
                asyncio.run(first())
        else:
            asyncio.run(second())
    finally:
        DBOS.destroy()


def recovery(args: argparse.Namespace) -> dict[str, Any]:
    marks_path = Path(args.logdir) / f"dbos_recovery_{os.getpid()}.marks"
    marks_path.unlink(missing_ok=True)
    env = {**os.environ, "RUNQ_BENCH_DBOS_MARKS": str(marks_path)}
    base = [sys.executable, __file__, "recovery-child", "--dsn", args.dsn]
    base += ["--recorded", str(args.recorded), "--workflow-id", f"recovery-{os.getpid()}"]
    base += ["--timeout", str(args.timeout)]
    log_path = Path(args.logdir) / "dbos_recovery.log"
    with log_path.open("w") as log_file:
        for phase in ("1", "2"):
            cmd = [*base, "--phase", phase, "--started", repr(time.time())]
            code = subprocess.run(
                cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT
            ).returncode
            expected = -signal.SIGKILL if phase == "1" else 0
            if code != expected:
                raise RuntimeError(f"phase {phase} exited {code}; log {log_path}")
    m = read_marks(str(marks_path))
    return {
        "recorded": args.recorded,
        "replay_s": round(m["first_new"] - m["entry"], 4),
        "restart_s": round(m["first_new"] - m["process_start_2"], 4),
        "recording_s": round(m["killed"] - m["process_start_1"], 4),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("role", choices=["w1", "steps", "recovery", "recovery-child", "run"])
    p.add_argument("--dsn", required=True)
    p.add_argument("--runs", type=int, default=common.W1_RUNS)
    p.add_argument("--batch", type=int, default=common.SUBMIT_BATCH)
    p.add_argument("--concurrency", type=int, default=common.CONCURRENCY)
    p.add_argument("--steps-per-run", type=int, default=0)
    p.add_argument("--poll", type=float, default=0.01, help="the queue's polling_interval_sec")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--recorded", type=int, default=1000)
    p.add_argument("--phase", default="1")
    p.add_argument("--started", default="0")
    p.add_argument("--workflow-id", default="recovery")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--cap", type=float, default=None)
    p.add_argument("--logdir", default="/tmp")
    p.add_argument("--pyspy", default=None)
    args = p.parse_args()
    if args.role == "recovery-child":
        recovery_child(args)
        return
    if args.role == "recovery":
        res = recovery(args)
    else:
        res = asyncio.run(w1(args) if args.role == "w1" else steps(args))
    import importlib.metadata as md

    res.update(system="dbos", role=args.role, version=md.version("dbos"))
    common.emit(res)


if __name__ == "__main__":
    main()
