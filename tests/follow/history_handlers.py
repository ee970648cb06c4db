"""Handlers the history tests' daemons load (``follow.history_handlers:NAME``)."""

from __future__ import annotations

from typing import Any

from runq.context import RunContext


async def ask(ctx: RunContext, payload: Any) -> Any:
    """Pauses with ``summary`` on its first execution; then answers with the decision."""
    if ctx.resume is None:
        await ctx.pause("approval", {"asked": True}, summary=payload.get("summary"))
    assert ctx.resume is not None
    return {"decision": ctx.resume.decision, "secret": payload.get("secret")}


async def done(ctx: RunContext, payload: Any) -> Any:
    """Records usage and answers with its payload."""
    await ctx.record_usage(tokens=7, cost=0.25)
    return {"echo": payload}
