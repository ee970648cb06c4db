"""runq: a durable queue for background runs.

import runq

async with runq.Queue.open("sqlite:///runq.db") as q:
    await q.defer("task", "echo", {"hello": "world"})

async def handler(ctx: runq.RunContext, payload: dict) -> dict:
    await ctx.checkpoint()
    raise runq.Permanent("bad input")   # fails without retry
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runq.context import RunContext
from runq.errors import (
    BadRequest,
    BudgetExhausted,
    ConfigError,
    Conflict,
    IdempotencyConflict,
    InvalidPayload,
    InvalidTransition,
    LeaseLost,
    NotFound,
    PauseRequested,
    Permanent,
    QueueFull,
    Retryable,
    RunCancelled,
    RunInterrupted,
    RunqError,
    SealError,
    StoreUnavailable,
    UnknownComponent,
)
from runq.model import Actor, Resume, Run, Status, SubmitResult

if TYPE_CHECKING:
    from runq.ops.operations import Operations
    from runq.queue import Queue

__version__ = "0.1.0"

__all__ = [
    "Actor",
    "BadRequest",
    "BudgetExhausted",
    "ConfigError",
    "Conflict",
    "IdempotencyConflict",
    "InvalidPayload",
    "InvalidTransition",
    "LeaseLost",
    "NotFound",
    "Operations",
    "PauseRequested",
    "Permanent",
    "Queue",
    "QueueFull",
    "Resume",
    "Retryable",
    "Run",
    "RunCancelled",
    "RunContext",
    "RunInterrupted",
    "RunqError",
    "SealError",
    "Status",
    "StoreUnavailable",
    "SubmitResult",
    "UnknownComponent",
]


def __getattr__(name: str) -> Any:
    # Queue and Operations pull in the store drivers; import them on first use so `import
    # runq` stays light for handler modules that only need RunContext and the errors.
    if name == "Queue":
        from runq.queue import Queue

        return Queue
    if name == "Operations":
        from runq.ops.operations import Operations

        return Operations
    raise AttributeError(f"module 'runq' has no attribute {name!r}")
