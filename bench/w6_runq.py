"""runq's side of W6, the durable features at a known price (project .venv).

    .venv/bin/python bench/w6_runq.py steps --engine postgres|sqlite --dsn DSN \
        [--steps 100] [--runs 20]
    .venv/bin/python bench/w6_runq.py replay --dsn DSN [--recorded 1000]
    .venv/bin/python bench/w6_runq.py fanout --dsn DSN [--children 1000]

Written against the API of the durable-runs and child-runs issues (``ctx.step(name, fn)``,
``ctx.spawn(...)``, ``ctx.join(children)``); each role first checks that
``runq.RunContext`` has what it needs and otherwise prints ``RESULT {"skipped": ...}``
and exits 0, so bench/run.py reports the part as not built yet. The worker is one
``runq serve`` subprocess (HTTP off) with the handlers of ``bench_components``; runs are
submitted and read back through ``runq.Queue`` (the public API), the children's times read
from the run table.

- ``steps``: ``--runs`` runs, one at a time (``max_concurrency = 1``), each making
  ``--steps`` no-op recorded steps; per-step time measured inside the handler; median.
- ``replay``: one run records ``--recorded`` steps, then fails once on purpose
  (``Retryable``, no delay, ``max_attempts = 2``); the retry's entry to its first new
  step is the replay time (issue 26 asks under 0.5 s for 1,000 steps on PostgreSQL).
- ``fanout``: one parent spawns ``--children`` no-op children and joins them
  (``max_concurrency = 16``): children per second (the parent's first entry to the last
  child's completion) and the parent's wake delay (the last child's completion to the
  parent's next entry).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

import runq
from runq.config import load_config

RUNQ_BIN = str(Path(sys.executable).parent / "runq")
SCHEMA = "runq"
NEEDS = {"steps": ("step",), "replay": ("step",), "fanout": ("spawn", "join")}
ISSUE = {"steps": "recorded steps, issue 26", "replay": "recorded steps, issue 26"}
ISSUE["fanout"] = "child runs, issue 27"


def missing_capability(role: str) -> str | None:
    absent = [name for name in NEEDS[role] if not hasattr(runq.RunContext, name)]
    if not absent:
        return None
    return f"runq.RunContext has no {', '.join(n + '()' for n in absent)} yet ({ISSUE[role]})"


COMPONENTS = {
    "task/noop": "bench_components:noop",
    "task/steps": "bench_components:many_steps",
    "task/replay": "bench_components:replay_steps",
    "task/fanout": "bench_components:fan_out",
}


def write_config(path: Path, url: str, concurrency: int) -> None:
    queue = {
        "max_concurrency": concurrency,
        "max_queue_depth": 0,
        "max_attempts": 2,  # replay: the planned failure, then the retry
        "retry_delay_seconds": 0,
    }
    path.write_text(common.runq_config_text(url, queue=queue, components=COMPONENTS))


async def wait_final(
    q: Any,
    run_ids: list[str],
    timeout: float,  # noqa: ASYNC109 - a deadline for all the runs
    worker: subprocess.Popen[Any],
) -> list[Any]:
    """The runs once every one is final (polled through ``Queue.get``); fails at once when
    the worker exits."""
    deadline = time.monotonic() + timeout
    while True:
        runs = [await q.get(run_id) for run_id in run_ids]
        if all(r is not None and r.is_final for r in runs):
            return runs
        if worker.poll() is not None:
            raise RuntimeError(f"runq serve exited with {worker.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"runs not final after {timeout}s: {run_ids[:3]}...")
        await asyncio.sleep(0.05)


def answer_of(run: Any) -> dict[str, Any]:
    if run.status != "completed" or not isinstance(run.answer, dict):
        raise RuntimeError(f"run {run.id} ended {run.status}: {run.error}")
    return dict(run.answer)


async def role_steps(
    args: argparse.Namespace, q: Any, worker: subprocess.Popen[Any]
) -> dict[str, Any]:
    ids = []
    for _ in range(args.runs):
        result = await q.defer("task", "steps", {"steps": args.steps})
        ids.append(result.run.id)
    runs = await wait_final(q, ids, args.timeout, worker)
    summary = common.step_summary([answer_of(r)["ms_per_step"] for r in runs])
    return {**summary, "steps": args.steps, "runs": args.runs}


async def role_replay(
    args: argparse.Namespace, q: Any, worker: subprocess.Popen[Any], workdir: Path
) -> dict[str, Any]:
    marker = workdir / "replay.marker"
    marker.unlink(missing_ok=True)
    result = await q.defer("task", "replay", {"recorded": args.recorded, "marker": str(marker)})
    (run,) = await wait_final(q, [result.run.id], args.timeout, worker)
    answer = answer_of(run)
    return {"recorded": args.recorded, "replay_s": round(answer["replay_s"], 4)}


async def role_fanout(
    args: argparse.Namespace, q: Any, worker: subprocess.Popen[Any], workdir: Path, url: str
) -> dict[str, Any]:
    marker = workdir / "fanout.marker"
    marker.unlink(missing_ok=True)
    payload = {"children": args.children, "marker": str(marker)}
    result = await q.defer("task", "fanout", payload)
    parent_id = result.run.id
    (run,) = await wait_final(q, [parent_id], args.timeout, worker)
    answer = answer_of(run)
    # The database holds the parent and its children only (a fresh one per measurement).
    con = await asyncpg.connect(url)
    try:
        n, last_done = await con.fetchrow(
            f"SELECT count(*), max(completed_at) FROM {SCHEMA}.runs "
            "WHERE id <> $1 AND status = 'completed'",
            parent_id,
        )
    finally:
        await con.close()
    span = last_done - answer["first_entry"]
    return {
        "children": args.children,
        "children_completed": int(n),
        "joined": answer["joined"],
        "children_per_s": round(int(n) / span, 1) if span > 0 else None,
        "wake_delay_ms": round((answer["entry"] - last_done) * 1000, 2),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    skipped = missing_capability(args.role)
    if skipped:
        common.log(f"skipped: {skipped}")
        return {"skipped": skipped}
    workdir = Path(args.logdir) / f"w6_runq_{args.role}_{args.engine}"
    workdir.mkdir(parents=True, exist_ok=True)
    if args.engine == "sqlite":
        for old in workdir.glob("w6.db*"):
            old.unlink()
        url = f"sqlite:///{workdir / 'w6.db'}"
    else:
        url = args.dsn
    cfg = workdir / "runq.toml"
    write_config(cfg, url, 1 if args.role == "steps" else common.CONCURRENCY)
    env = common.runq_env(common.new_seal_key())
    os.environ["RUNQ_SEAL_KEY"] = env["RUNQ_SEAL_KEY"]
    config = load_config(cfg, environ=env)
    log_path = Path(args.logdir) / f"w6_runq_{args.role}_{args.engine}_worker.log"
    async with runq.Queue.open(config=config) as q:
        proc = common.start_process(
            [RUNQ_BIN, "serve", "--config", str(cfg), "--log-format", "json"],
            env=env,
            log_path=log_path,
        )
        try:
            if args.role == "steps":
                return await role_steps(args, q, proc)
            if args.role == "replay":
                return await role_replay(args, q, proc, workdir)
            return await role_fanout(args, q, proc, workdir, url)
        except Exception:
            common.log(common.tail(log_path))
            raise
        finally:
            common.stop_process(proc)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("role", choices=sorted(NEEDS))
    p.add_argument("--engine", choices=["postgres", "sqlite"], default="postgres")
    p.add_argument("--dsn", default=os.environ.get("RUNQ_BENCH_DSN", ""))
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--recorded", type=int, default=1000)
    p.add_argument("--children", type=int, default=1000)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--logdir", default="/tmp")
    args = p.parse_args()
    if args.engine == "postgres" and not args.dsn:
        p.error("--dsn is required for PostgreSQL")
    if args.role == "fanout" and args.engine != "postgres":
        p.error("fanout runs on PostgreSQL")
    res = asyncio.run(main_async(args))
    res.update(system="runq", role=args.role, engine=args.engine)
    common.emit(res)


if __name__ == "__main__":
    main()
