"""Built-in components, available without configuration (``[components]`` may override).

- ``task/echo``: answers its payload.
- ``task/sleep``: sleeps ``payload.seconds`` with one checkpoint a second (so a cancel or
  a lost lease stops it within a second).
- ``task/fail``: raises ``payload.message``; permanent (no retry) when ``payload.permanent``.
"""

from __future__ import annotations

from typing import Any

import anyio

from runq.context import RunContext
from runq.errors import Permanent


async def echo(ctx: RunContext, payload: Any) -> Any:
    return payload


def _field(payload: Any, name: str, default: Any) -> Any:
    return payload.get(name, default) if isinstance(payload, dict) else default


async def sleep(ctx: RunContext, payload: Any) -> Any:
    try:
        seconds = float(_field(payload, "seconds", 1.0))
    except (TypeError, ValueError) as e:
        raise Permanent("task/sleep needs a number in payload.seconds") from e
    remaining = max(seconds, 0.0)
    while remaining > 0:
        step = min(1.0, remaining)
        await anyio.sleep(step)
        remaining -= step
        await ctx.checkpoint()
    return {"slept": seconds}


class TaskFailed(Exception):
    """The retryable failure ``task/fail`` raises."""


async def fail(ctx: RunContext, payload: Any) -> Any:
    message = str(_field(payload, "message", "task/fail was asked to fail"))
    if _field(payload, "permanent", False):
        raise Permanent(message)
    raise TaskFailed(message)


BUILTINS: dict[str, str] = {
    "task/echo": "runq.builtin:echo",
    "task/sleep": "runq.builtin:sleep",
    "task/fail": "runq.builtin:fail",
}
