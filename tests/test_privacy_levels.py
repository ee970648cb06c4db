"""Each privacy level on a completed run and on a paused one, through the real executor
(the ``sync`` route executes ``enqueue()`` in the test process), on both engines."""

from __future__ import annotations

from typing import Any

import pytest
from serve_harness import RunqSetup, runq_engine, runq_setup

from runq.model import Status
from runq.privacy import MASK
from runq.worker.claimer import sweep
from runq.worker.runtime import WorkerRuntime

pytestmark = [pytest.mark.anyio]
__all__ = ["runq_engine", "runq_setup"]  # fixtures used by name

SECRET_ANSWER = {"to": "alice@example.com", "note": "fine"}
EXPECTED: dict[str, Any] = {
    "none": None,
    "redacted": {"to": MASK, "note": "fine"},
    "metadata": SECRET_ANSWER,
    "full": SECRET_ANSWER,
}


@pytest.mark.parametrize("level", sorted(EXPECTED))
async def test_a_completed_run_keeps_its_answer_per_level(
    runq_setup: RunqSetup, level: str
) -> None:
    async with runq_setup.queue({"privacy": {"level": level}}) as q:
        run = await q.enqueue("task", "echo", SECRET_ANSWER)
        assert run.status is Status.COMPLETED
        stored = await q.get(run.id)
        assert stored is not None
        assert stored.answer == EXPECTED[level]


@pytest.mark.parametrize("level", sorted(EXPECTED))
async def test_a_paused_run_keeps_its_resume_state_verbatim_at_every_level(
    runq_setup: RunqSetup, level: str
) -> None:
    privacy = {"level": level, "keep_answer_after_approval": True}
    async with runq_setup.queue({"privacy": privacy}) as q:
        paused = await q.enqueue("task", "approve", {})
        assert paused.status is Status.PAUSED
        stored = await q.get(paused.id)
        assert stored is not None
        assert stored.resume is not None
        assert stored.resume.state == {"step": 1}  # kept whatever the level

        await q.continue_(paused.id, {"approved_by": "bob@example.com"})
        runtime = WorkerRuntime(store=q.store, config=q.config, components=q.components)
        await sweep(q.store, runtime, limit=1, time_limit=30, deployment_id=None)
        done = await q.get(paused.id)
        assert done is not None
        assert done.status is Status.COMPLETED
        assert done.resume is None  # cleared when the run became final
        answer = {"state": {"step": 1}, "decision": {"approved_by": "bob@example.com"}}
        expected = {
            "none": None,
            "redacted": {"state": {"step": 1}, "decision": {"approved_by": MASK}},
        }.get(level, answer)
        assert done.answer == expected
