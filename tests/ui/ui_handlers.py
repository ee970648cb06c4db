"""Components the console tests' daemons load (``PYTHONPATH`` gets ``tests/ui``)."""

from __future__ import annotations

from typing import Any

from runq.context import RunContext
from runq.errors import Permanent


async def fail_first(ctx: RunContext, payload: Any) -> Any:
    """A dead letter on its first attempt, a success on any later one (after a requeue)."""
    if ctx.attempt == 1:
        raise Permanent("the first attempt always fails")
    return {"attempt": ctx.attempt}


#: What ``ask`` asks its approver: with markup and a terminal escape, both shown literally.
ASK_SUMMARY = 'Refund <b>120 EUR</b> to order 42? [bold]yes[/] \x1b]52;c;aGk=\x07 "ok"'


async def ask(ctx: RunContext, payload: Any) -> Any:
    """Pauses once with a summary for the approver (the payload's ``summary``, else
    ``ASK_SUMMARY``); answers with the decision it got."""
    if ctx.resume is None:
        asked = payload.get("summary") if isinstance(payload, dict) else None
        await ctx.pause("approval", summary=asked or ASK_SUMMARY)
    return {"decision": ctx.resume.decision if ctx.resume else None}
