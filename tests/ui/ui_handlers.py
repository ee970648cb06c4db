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
