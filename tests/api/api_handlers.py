"""Components the API tests' daemons load (``PYTHONPATH`` gets ``tests/api``).

``approve`` pauses for a decision on its first execution; the continuation answers with
the decision and the actor it runs as (which proves the actor frozen at submission is
restored in the worker). ``payload.linger`` keeps the continuation running a while so a
second continue lands while it is still in flight.
"""

from __future__ import annotations

from typing import Any

import anyio

from runq.context import RunContext


async def approve(ctx: RunContext, payload: Any) -> Any:
    if ctx.resume is None:
        await ctx.pause("approval", {"asked": payload})
    linger = float(payload.get("linger", 0)) if isinstance(payload, dict) else 0.0
    if linger:
        await anyio.sleep(linger)
    assert ctx.resume is not None
    return {
        "decision": ctx.resume.decision,
        "actor": {
            "user_id": ctx.actor.user_id,
            "service_account": ctx.actor.service_account,
            "scopes": list(ctx.actor.scopes),
        },
    }


async def ticker(ctx: RunContext, payload: Any) -> Any:
    """Emits ``payload.ticks`` ``tick`` events ``payload.every`` seconds apart (a run long
    enough for a client to lose its event stream in the middle)."""
    ticks, every = int(payload["ticks"]), float(payload["every"])
    for i in range(ticks):
        await ctx.emit("tick", {"i": i})
        await anyio.sleep(every)
    return {"ticks": ticks}
