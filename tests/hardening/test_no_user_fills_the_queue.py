"""Finding 3 (depth part): no user can fill the queue for everyone.

Delayed runs counted against ``max_queue_depth``: a handful of year-long delays made every
next submit a 429. Now a due run is gated by the due runs, a delayed run by the delayed runs
(``[queue] max_delayed``), and one user's queued runs by ``[queue] max_queued_per_user``.
Runs through ``Queue`` on the configured store, both engines.
"""

from __future__ import annotations

from typing import Any

import pytest
from serve_harness import RunqSetup, pg_ready, runq_engine, runq_setup

from runq.errors import QueueFull
from runq.model import Actor

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

__all__ = ["pg_ready", "runq_engine", "runq_setup"]  # fixtures used by name

A_YEAR = 365 * 86400.0


def _limits(**queue: Any) -> dict[str, Any]:
    return {"queue": {"worker": False, **queue}}


async def test_year_long_delays_do_not_fill_the_queue(runq_setup: RunqSetup) -> None:
    async with runq_setup.queue(_limits(max_queue_depth=2, max_delayed=5)) as q:
        for _ in range(5):
            await q.defer("task", "echo", {}, delay_seconds=A_YEAR)
        # Five delayed runs, a depth of two: due runs are still admitted.
        await q.defer("task", "echo", {})
        await q.defer("task", "echo", {})
        with pytest.raises(QueueFull, match="max_queue_depth"):
            await q.defer("task", "echo", {})
        # Delayed runs have their own bound.
        with pytest.raises(QueueFull, match="max_delayed"):
            await q.defer("task", "echo", {}, delay_seconds=A_YEAR)


async def test_one_user_cannot_fill_the_queue_for_everyone(runq_setup: RunqSetup) -> None:
    async with runq_setup.queue(_limits(max_queued_per_user=3)) as q:
        greedy, other = Actor(user_id="greedy"), Actor(user_id="other")
        for delay in (0.0, 0.0, A_YEAR):
            await q.defer("task", "echo", {}, actor=greedy, delay_seconds=delay)
        with pytest.raises(QueueFull, match="max_queued_per_user"):
            await q.defer("task", "echo", {}, actor=greedy)
        await q.defer("task", "echo", {}, actor=other)
        # A duplicate is answered even at the limit (idempotency comes first).
        first = await q.defer("task", "echo", {}, actor=other, idempotency_key="k")
        again = await q.defer("task", "echo", {}, actor=other, idempotency_key="k")
        assert (again.run.id, again.created) == (first.run.id, False)
