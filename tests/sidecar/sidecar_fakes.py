"""A real ``RunContext`` over fake executor hooks, for unit tests of the sidecar handlers.

The hooks record what a handler asked of the executor (checkpoints, usage, lease-renewal
requests). A cancel reaches a real handler as a cancelled scope; tests do that directly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from runq.context import RunContext
from runq.limits.budget import BudgetLeft
from runq.model import Actor, Resume


@dataclass
class FakeHooks:
    checkpoints: list[float] = field(default_factory=list)
    renewals_asked: int = 0
    usage: list[tuple[int, float]] = field(default_factory=list)

    async def checkpoint(self) -> None:
        self.checkpoints.append(time.monotonic())

    async def set_non_idempotent(self, inside: bool) -> None:
        return None

    async def record_usage(self, tokens: int, cost: float) -> None:
        self.usage.append((tokens, cost))

    async def budget_left(self) -> BudgetLeft | None:
        return None

    def renew_lease_soon(self) -> None:
        self.renewals_asked += 1


def make_ctx(
    hooks: FakeHooks | None = None,
    *,
    run_id: str = "0191e0c4-0000-7000-8000-000000000001",
    attempt: int = 1,
    session_id: str | None = "session-7",
    user_id: str | None = "alice",
    resume: Resume | None = None,
    payload: Any = None,
    component: str = "task/render",
) -> tuple[RunContext, FakeHooks]:
    hooks = hooks or FakeHooks()
    ctype, _, cid = component.partition("/")
    ctx = RunContext(
        run_id=run_id,
        attempt=attempt,
        component_type=ctype,
        component_id=cid,
        actor=Actor(user_id=user_id),
        session_id=session_id,
        configuration=None,
        resume=resume,
        payload=payload,
        hooks=hooks,
    )
    return ctx, hooks
