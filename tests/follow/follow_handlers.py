"""Handlers the follow tests' daemons load (``follow.follow_handlers:NAME``)."""

from __future__ import annotations

from typing import Any

import anyio

from runq.context import RunContext


async def emit(ctx: RunContext, payload: Any) -> Any:
    """Emits ``count`` ``delta`` events (``i`` = 0, 1, ...), ``every`` seconds apart, then
    answers; ``pause``: pauses after emitting on its first execution."""
    count = int(payload.get("count", 10))
    every = float(payload.get("every", 0))
    for i in range(count):
        await ctx.emit("delta", {"i": i, "text": payload.get("text", "")})
        if every:
            await anyio.sleep(every)
    if payload.get("pause") and ctx.resume is None:
        await ctx.pause("approval", {"emitted": count})
    return {"emitted": count}
