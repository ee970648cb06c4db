"""Handlers the bench registers in ``[components]`` (``bench/`` is put on PYTHONPATH).

``noop`` is the no-op run of W1/W3/W4/mem; ``emit_ten`` (W6) emits 10 events per run and
``one_step`` (W6) records one no-op step (``ctx.step``, once runq has it); ``record_start``
is W2's: it answers the submit time its producer put in the payload next to the time the
handler started, so the latency is computed from the stored answers after the run.
``noop`` notes its first call on ``common.PROBE``: the in-process variant times its drain
and counts its CPU from there.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import common

_hit = common.PROBE.hit


async def noop(ctx: Any, payload: Any) -> None:
    _hit()


async def emit_ten(ctx: Any, payload: Any) -> None:
    _hit()
    for i in range(10):
        await ctx.emit("progress", {"i": i})


async def _nothing() -> None:
    return None


async def one_step(ctx: Any, payload: Any) -> None:
    _hit()
    await ctx.step("noop", _nothing)


async def record_start(ctx: Any, payload: Any) -> dict[str, Any]:
    started = time.time()
    submitted = payload.get("t") if isinstance(payload, dict) else None
    return {"t": submitted, "started": started}


# -- W6: recorded steps and child runs (issues 26 and 27; w6_runq.py checks that runq has
# them before it submits these) ------------------------------------------------------------


async def many_steps(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """``payload["steps"]`` no-op recorded steps; the time per step, measured here."""
    n = int(payload["steps"])
    t0 = time.perf_counter()
    for i in range(n):
        await ctx.step(f"s{i}", _nothing)
    return {"ms_per_step": (time.perf_counter() - t0) * 1000 / n}


async def replay_steps(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """``payload["recorded"]`` steps, then one that fails the first execution with a
    planned ``Retryable`` (the marker file says whether it already did): the retry replays
    the recorded steps and reaches that step again. Answers the retry's entry and the time
    its first new step started."""
    from runq import Retryable

    entry = time.time()
    for i in range(int(payload["recorded"])):
        await ctx.step(f"s{i}", _nothing)
    marker = Path(payload["marker"])

    async def first_new() -> float:
        reached = time.time()
        # One stat and write of a marker file per execution, outside the measured span.
        if not marker.exists():  # noqa: ASYNC240
            marker.write_text(str(reached))  # noqa: ASYNC240
            raise Retryable("the bench's planned failure after the recorded steps", 0)
        return reached

    reached = await ctx.step("first-new", first_new)
    return {"entry": entry, "first_new": reached, "replay_s": reached - entry}


async def fan_out(ctx: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Spawns ``payload["children"]`` no-op children and joins them. The join ends the
    execution while children run; the execution that returns answers its own entry time
    (the wake) and the first execution's (from the marker file)."""
    entry = time.time()
    marker = Path(payload["marker"])
    if not marker.exists():  # noqa: ASYNC240 - once per execution, as above
        marker.write_text(str(entry))  # noqa: ASYNC240
    children = [
        await ctx.spawn("task", "noop", {"i": i}, key=f"c{i}")
        for i in range(int(payload["children"]))
    ]
    outcomes = await ctx.join(children)
    first_entry = float(marker.read_text())  # noqa: ASYNC240
    return {"first_entry": first_entry, "entry": entry, "joined": len(outcomes)}
