"""``Queue.wait``, ``Queue.events`` and ``Queue.cancel``'s trimming, in the test process on
both engines (the store verbs play the worker)."""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
from helpers import wait_for
from serve_harness import RunqSetup, pg_ready, pg_setup, runq_engine, runq_setup

from runq.errors import NotFound
from runq.model import Lease, Status
from runq.store.events import new_event

pytestmark = pytest.mark.anyio
__all__ = ["pg_ready", "pg_setup", "runq_engine", "runq_setup"]


async def test_wait_events_and_cancel_of_a_paused_run(runq_setup: RunqSetup) -> None:
    async with runq_setup.queue() as q:
        new = q.new_run("task", "echo", {"x": 1})
        run = (await q.store.submit(new, max_queue_depth=0)).run
        (claimed,) = await q.store.claim("w1", 1, deployment_id=None, run_id=run.id)
        lease = Lease(run.id, claimed.attempt)

        started = time.monotonic()
        still = await q.wait(run.id, timeout=0.3)
        assert still.status is Status.RUNNING
        assert time.monotonic() - started >= 0.3

        seen: list[Any] = []

        async def follow() -> None:
            async for event in q.events(run.id):
                seen.append((event.seq, event.kind, event.data))

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await q.store.append_events("w1", lease, [new_event("step", {"n": 1})])
            # The live follower reads the step in full before the cancel below trims it.
            await wait_for(lambda: len(seen) >= 3, timeout=10, message="the step event")
            assert await q.store.pause("w1", lease, reason="approval", state=None)
            assert (await q.wait(run.id, timeout=10)).status is Status.PAUSED
            cancelled = await q.cancel(run.id)
            assert cancelled.status is Status.CANCELLED
        # The follower ended by itself after the final event.
        assert [kind for _, kind, _ in seen] == [
            "submitted",
            "claimed",
            "step",
            "paused",
            "cancelled",
        ]
        assert [seq for seq, _, _ in seen] == [1, 2, 3, 4, 5]
        assert seen[2][2] == {"n": 1}
        # Cancelled by the operator, not by an executor: trimmed all the same (metadata).
        stored = await q.store.list_events(run.id, after=0, limit=10)
        assert stored[2].data is None
        with pytest.raises(NotFound):
            await q.wait("0190f1c2-0000-7000-8000-000000000000", timeout=1)
