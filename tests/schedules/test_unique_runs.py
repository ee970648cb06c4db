"""Unique runs on both engines: one run per (component, unique key) while it counts, for
every user and every submitter at once; distinct from the per-user idempotency key."""

from __future__ import annotations

import anyio
import pytest
from serve_harness import RunqSetup, runq_engine, runq_setup  # fixtures are used by name

from runq.errors import BadRequest
from runq.model import Actor, SubmitResult

pytestmark = pytest.mark.anyio

_FIXTURES = (runq_engine, runq_setup)


async def test_twenty_concurrent_submitters_make_one_run(runq_setup: RunqSetup) -> None:
    async with runq_setup.queue() as q:
        results: list[SubmitResult] = []

        async def submit(i: int) -> None:
            results.append(
                await q.defer(
                    "task",
                    "record",
                    {"i": i},
                    actor=Actor(user_id=f"user-{i}"),  # across users
                    unique_key="nightly-report",
                    unique_for_seconds=60,
                )
            )

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(submit, i)
        created = [r for r in results if r.created]
        assert len(created) == 1
        assert {r.run.id for r in results} == {created[0].run.id}
        assert await q.store.count_runs() == 1


async def test_window_and_states_decide_when_a_new_run_is_made(runq_setup: RunqSetup) -> None:
    async with runq_setup.queue() as q:
        first = await q.defer("task", "record", unique_key="k", unique_for_seconds=30)
        assert first.created
        # Another component with the same key is another run.
        other = await q.defer("task", "slow", unique_key="k", unique_for_seconds=30)
        assert other.created
        # Not final: counts even after the window.
        q.store.clock_offset_seconds = 100
        again = await q.defer("task", "record", unique_key="k", unique_for_seconds=30)
        assert (again.created, again.run.id) == (False, first.run.id)
        # Final and created within the window: still the same run.
        await q.cancel(first.run.id)
        q.store.clock_offset_seconds = 0
        again = await q.defer("task", "record", unique_key="k", unique_for_seconds=30)
        assert (again.created, again.run.id) == (False, first.run.id)
        # unique_states without "cancelled": the cancelled run no longer counts.
        fresh = await q.defer(
            "task", "record", unique_key="k", unique_for_seconds=30, unique_states=["queued"]
        )
        assert fresh.created
        # Final and outside the window: a new run.
        await q.cancel(fresh.run.id)
        q.store.clock_offset_seconds = 31
        later = await q.defer("task", "record", unique_key="k", unique_for_seconds=30)
        assert later.created
        assert later.run.id not in (first.run.id, fresh.run.id)


async def test_bad_unique_options_are_refused(runq_setup: RunqSetup) -> None:
    async with runq_setup.queue() as q:
        for options in (
            {"unique_key": ""},
            {"unique_key": "x" * 201},
            {"unique_key": "k", "unique_for_seconds": -1},
            {"unique_key": "k", "unique_for_seconds": float("nan")},
            {"unique_key": "k", "unique_states": ["sleeping"]},
            {"unique_key": "k", "unique_states": []},
            {"unique_for_seconds": 5},
        ):
            with pytest.raises(BadRequest):
                await q.defer("task", "record", **options)
        assert await q.store.count_runs() == 0
