"""The component the chaos replicas execute (``"task/chaos" = "reliability.chaos_handlers:chaos"``).

The daemons import it through the harness's ``PYTHONPATH`` (``tests/`` is on it, and
``tests/reliability`` is a package). Per execution it leaves evidence the test reads back:

* one line ``run_id attempt pid`` appended to ``$RUNQ_TEST_WORKDIR/chaos_executions.log``
  before any work (one short ``O_APPEND`` write: it survives a SIGKILL of the writer and
  never interleaves with another process's line);
* for runs with ``payload.side``: inside ``ctx.non_idempotent()``, one row
  ``(run_id, attempt, pid)`` in ``{CHAOS_SCHEMA}.chaos_side``, then a sleep (so kills land
  inside the section), then ``finished = true`` on that row as the section's last write.
  A row left unfinished is an execution that died inside its non-idempotent section.

The answer names the attempt and the process, so the test can tell which execution's
completion the database kept.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import asyncpg

from runq.context import RunContext

EXECUTIONS_LOG = "chaos_executions.log"

_pool: asyncpg.Pool | None = None
_pool_lock: anyio.Lock | None = None


def executions_path(workdir: Path | None = None) -> Path:
    base = workdir or Path(os.environ.get("RUNQ_TEST_WORKDIR", "."))
    return base / EXECUTIONS_LOG


def read_executions(workdir: Path) -> list[tuple[str, int, int]]:
    """(run id, attempt, pid) per execution started, in the order they were written."""
    path = executions_path(workdir)
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        run_id, attempt, pid = line.split()
        rows.append((run_id, int(attempt), int(pid)))
    return rows


def _append(line: str) -> None:
    fd = os.open(executions_path(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


async def _side_pool() -> asyncpg.Pool:
    global _pool, _pool_lock
    if _pool_lock is None:
        _pool_lock = anyio.Lock()
    async with _pool_lock:
        if _pool is None:
            _pool = await asyncpg.create_pool(
                os.environ["CHAOS_PG_URL"], min_size=1, max_size=4, command_timeout=30
            )
    return _pool


async def chaos(ctx: RunContext, payload: Any) -> Any:
    _append(f"{ctx.run_id} {ctx.attempt} {os.getpid()}\n")
    seconds = float(payload.get("sleep_ms", 0)) / 1000.0
    if not payload.get("side"):
        await anyio.sleep(seconds)
        return {"attempt": ctx.attempt, "pid": os.getpid()}
    schema = os.environ["CHAOS_SCHEMA"]
    await anyio.sleep(seconds / 3)
    async with ctx.non_idempotent():
        pool = await _side_pool()
        await pool.execute(
            f"INSERT INTO {schema}.chaos_side (run_id, attempt, pid) VALUES ($1, $2, $3)",
            ctx.run_id,
            ctx.attempt,
            os.getpid(),
        )
        await anyio.sleep(seconds * 2 / 3)
        await pool.execute(
            f"UPDATE {schema}.chaos_side SET finished = true WHERE run_id = $1 AND attempt = $2",
            ctx.run_id,
            ctx.attempt,
        )
    return {"attempt": ctx.attempt, "pid": os.getpid()}
