"""Components the harness's daemons load (``PYTHONPATH`` includes ``tests/``).

``record`` appends one line per execution to ``$RUNQ_TEST_WORKDIR/executions.log`` so a
test can count how often each run executed and where; ``ledger`` does the same in
``ledger.log`` with the time and an fsync before the handler returns (a line is an
execution that happened, whatever crashed after it); ``block`` is a plain function that
blocks its thread; ``slow`` is an async handler that sleeps without checkpoints.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio

from runq.context import RunContext
from runq.errors import Retryable


def executions_log() -> Path:
    return Path(os.environ.get("RUNQ_TEST_WORKDIR", ".")) / "executions.log"


def read_executions(workdir: Path) -> list[tuple[str, int, int]]:
    """(run id, attempt, pid) per execution recorded by ``record``."""
    path = workdir / "executions.log"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        run_id, attempt, pid = line.split()
        rows.append((run_id, int(attempt), int(pid)))
    return rows


async def record(ctx: RunContext, payload: Any) -> Any:
    # One short O_APPEND write per line: concurrent writers never interleave within it.
    line = f"{ctx.run_id} {ctx.attempt} {os.getpid()}\n".encode()
    fd = os.open(executions_log(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    options = payload if isinstance(payload, dict) else {}
    # "first_seconds": only the first attempt is slow (a retry after a kill finishes fast).
    seconds = float(options.get("seconds", 0))
    if ctx.attempt == 1:
        seconds += float(options.get("first_seconds", 0))
    if seconds:
        await anyio.sleep(seconds)
    return {"echo": payload, "pid": os.getpid()}


def ledger_path(workdir: Path | None = None) -> Path:
    base = workdir or Path(os.environ.get("RUNQ_TEST_WORKDIR", "."))
    return base / "ledger.log"


def _append_durably(path: Path, line: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


async def ledger(ctx: RunContext, payload: Any) -> Any:
    """Records the execution durably first (in a thread: an fsync must not stall the
    daemon's event loop), then sleeps ``seconds``."""
    line = f"{ctx.run_id} {ctx.attempt} {os.getpid()} {time.time():.6f}\n".encode()
    await anyio.to_thread.run_sync(_append_durably, ledger_path(), line)
    options = payload if isinstance(payload, dict) else {}
    seconds = float(options.get("seconds", 0))
    if seconds:
        await anyio.sleep(seconds)
    return {"pid": os.getpid()}


def read_ledger(workdir: Path) -> list[tuple[str, int, int, float]]:
    """(run id, attempt, pid, epoch seconds) per execution recorded by ``ledger``."""
    path = ledger_path(workdir)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        run_id, attempt, pid, at = line.split()
        rows.append((run_id, int(attempt), int(pid), float(at)))
    return rows


def block(ctx: RunContext, payload: Any) -> Any:
    """A plain function: blocks its worker thread; the loop keeps heartbeating meanwhile."""
    seconds = float(payload.get("seconds", 1))
    time.sleep(seconds)
    return {"slept": seconds, "pid": os.getpid()}


async def slow(ctx: RunContext, payload: Any) -> Any:
    """Sleeps without a checkpoint: only a cancel of its scope (or the timeout) stops it."""
    await anyio.sleep(float(payload.get("seconds", 1)))
    return {"slept": payload.get("seconds", 1)}


async def approve(ctx: RunContext, payload: Any) -> Any:
    """Pauses for a decision on its first execution; answers with state and decision."""
    if ctx.resume is None:
        await ctx.pause("approval", {"step": 1})
    assert ctx.resume is not None
    return {"state": ctx.resume.state, "decision": ctx.resume.decision}


async def flaky(ctx: RunContext, payload: Any) -> Any:
    raise Retryable("rate limited", retry_after=float(payload.get("retry_after", 120)))


async def spend(ctx: RunContext, payload: Any) -> Any:
    await ctx.record_usage(tokens=10, cost=0.5)
    ctx.stop_for_budget({"partial": True})


async def half_written(ctx: RunContext, payload: Any) -> Any:
    async with ctx.non_idempotent():
        raise RuntimeError("failed after the write may have happened")


async def swallow(ctx: RunContext, payload: Any) -> Any:
    """Tries to swallow interruptions with ``except Exception``; it cannot."""
    for _ in range(600):
        try:
            await ctx.checkpoint()
            await anyio.sleep(0.05)
        except Exception:
            return "swallowed"
    return "never interrupted"
