"""Why a run waits, and the held-back counts, decided from their inputs (pure)."""

from __future__ import annotations

import pytest

from runq.config import LimitConfig
from runq.limits import LimitRules, LimitState
from runq.limits.waits import WaitInputs, explain, held_counts
from runq.model import Actor, Pause, QueuedCount, Run, Status, WaitReason

NOW = 1_800_000_000.5
RULES = LimitRules.from_limits(
    {
        "agent/*": LimitConfig(max_running=4),
        "task/email": LimitConfig(rate="100/minute"),
    }
)


def queued(component: str, **kw: object) -> Run:
    ctype, _, cid = component.partition("/")
    fields: dict[str, object] = {
        "id": "r1", "component_type": ctype, "component_id": cid, "status": Status.QUEUED,
        "attempt": 0, "max_attempts": 1, "priority": 0, "session_id": None, "user_id": None,
        "actor": Actor(), "configuration": None, "deployment_id": None,
        "idempotency_key": None, "origin": "python", "created_at": NOW, "updated_at": NOW,
        "available_at": NOW, "started_at": None, "completed_at": None, "locked_by": None,
        "locked_at": None, "error": None, "termination_reason": None, "pause_reason": None,
        "cancel_requested": False, "non_idempotent": False, "has_request": True,
    }  # fmt: skip
    fields.update(kw)
    return Run(**fields)  # type: ignore[arg-type]


def state(running: dict[str, int] | None = None, used: int = 0) -> LimitState:
    window = NOW - NOW % 60
    return LimitState(now=NOW, running=running or {}, windows={"task/email": (window, used)})


BUDGET = WaitReason(kind="budget", message="budget user:day of user alice exhausted")


def pause(kind: str, target: str) -> Pause:
    return Pause(id="p1", kind=kind, target=target, reason="outage", created_by=None, created_at=0)


@pytest.mark.parametrize(
    ("run", "inputs", "kind", "message"),
    [
        (queued("agent/x", available_at=NOW + 60), WaitInputs(state(), []), "delayed",
         "delayed until 2027-01-15T08:01:00Z"),
        (queued("agent/x"), WaitInputs(state(), [pause("component", "agent/*")]), "paused",
         "paused (component agent/*: outage)"),
        (queued("agent/x", deployment_id="blue"),
         WaitInputs(state(), [pause("deployment", "blue")]),
         "paused", "paused (deployment blue: outage)"),
        (queued("agent/x", session_id="s"), WaitInputs(state(), [], session_ahead=True), "session",
         "behind an earlier run of session s"),
        (queued("agent/x"), WaitInputs(state({"agent/x": 3, "agent/y": 1}), []), "limit",
         "held by limit agent/* (4/4 running)"),
        (queued("task/email"), WaitInputs(state(used=100), []), "rate",
         "rate task/email (next slot at 2027-01-15T08:01:00Z)"),
        (queued("task/x", deployment_id="gpu"), WaitInputs(state(), [], deployment_served=False),
         "no_worker", "no live worker serves deployment gpu"),
        # A budget hold comes before a full limit: the claim never considers the run.
        (queued("agent/x"), WaitInputs(state({"agent/x": 4}), [], budget=BUDGET), "budget",
         BUDGET.message),
        (queued("agent/x"), WaitInputs(state(), [pause("component", "agent/*")], budget=BUDGET),
         "paused", "paused (component agent/*: outage)"),
    ],
)  # fmt: skip
def test_explain(run: Run, inputs: WaitInputs, kind: str, message: str) -> None:
    reason = explain(run, RULES, inputs)
    assert reason is not None
    assert (reason.kind, reason.message) == (kind, message)


def test_nothing_holds_a_run_with_room() -> None:
    assert explain(queued("agent/x"), RULES, WaitInputs(state({"agent/x": 3}), [])) is None
    assert explain(queued("task/email"), RULES, WaitInputs(state(used=99), [])) is None
    # A stale window (an earlier minute) is spent no more.
    stale = LimitState(now=NOW, running={}, windows={"task/email": (NOW - 120, 100)})
    assert explain(queued("task/email"), RULES, WaitInputs(stale, [])) is None


def test_held_counts_by_reason() -> None:
    rows = [
        QueuedCount("agent/x", "", 5, 2, 1),  # 1 over budget, the rest behind the full limit
        QueuedCount("task/email", "", 3, 0),  # rate spent
        QueuedCount("task/other", "gpu", 4, 0),  # nobody serves gpu
        QueuedCount("task/other", "", 6, 1, 6),  # all over budget
        QueuedCount("task/free", "", 6, 0),  # runs
        QueuedCount("job/paused", "", 2, 0, 2),  # a pause comes before the budget
    ]
    counts = held_counts(
        rows, RULES, state({"agent/x": 4}, used=100), [pause("component", "job/*")], set()
    )
    assert counts == {
        "delayed": 3, "paused": 2, "budget": 7, "limit": 4, "rate": 3, "no_worker": 4
    }  # fmt: skip
