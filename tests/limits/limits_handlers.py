"""Components the limits tests' daemons load (``PYTHONPATH`` includes ``tests/``)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio

from runq.context import RunContext


def spans_log(workdir: Path | None = None) -> Path:
    return (workdir or Path(os.environ.get("RUNQ_TEST_WORKDIR", "."))) / "spans.log"


async def span(ctx: RunContext, payload: Any) -> Any:
    """Sleeps ``seconds`` and appends "key start end" (wall clock of this machine, which
    every replica shares), so a test can see which executions overlapped."""
    started = time.time()
    await anyio.sleep(float(payload.get("seconds", 0.1)))
    line = f"{payload.get('key', '-')} {started!r} {time.time()!r}\n".encode()
    fd = os.open(spans_log(), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return None


def read_spans(workdir: Path) -> list[tuple[str, float, float]]:
    rows = []
    for line in spans_log(workdir).read_text(encoding="utf-8").splitlines():
        key, start, end = line.split()
        rows.append((key, float(start), float(end)))
    return rows
