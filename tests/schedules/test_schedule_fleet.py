"""Schedules across real ``runq serve`` replicas on both engines: one run per slot while
replicas are SIGKILLed and restarted, and a start refused for a schedule whose component
does not exist."""

from __future__ import annotations

import time

import anyio
import pytest
from serve_harness import (  # fixtures are used by name
    RunqSetup,
    ServeFactory,
    runq_engine,
    runq_setup,
    serve_factory,
)

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

_FIXTURES = (runq_engine, runq_setup, serve_factory)

#: How long the fleet runs under kills; every slot in it must fire exactly once.
CHAOS_SECONDS = 15.0
KILL_EVERY_SECONDS = 3.0

EVERY_SECOND = {
    "name": "every-second",
    "cron": "* * * * * *",
    "component": "task/record",
    # Dropped rather than caught up: a slot missing from the record is then a lost slot.
    "catch_up": "none",
    "grace_seconds": 5,
}


async def test_one_run_per_slot_while_replicas_are_killed(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    config = {"queue": {"lock_grace_seconds": 3}, "schedules": [EVERY_SECOND]}
    replicas = [await serve_factory(config) for _ in range(3)]
    deadline = time.monotonic() + CHAOS_SECONDS
    victim = 0
    while time.monotonic() < deadline:
        await anyio.sleep(KILL_EVERY_SECONDS)  # the pace of the chaos, not a wait for a result
        replicas[victim].kill()
        await replicas[victim].start()
        victim = (victim + 1) % len(replicas)
    for replica in replicas:
        await replica.terminate()
    async with runq_setup.queue({"schedules": [EVERY_SECOND]}) as q:
        slots = sorted(await q.store.recent_schedule_slots("every-second", limit=10_000))
        times = [slot for slot, _ in slots]
        assert len(times) >= CHAOS_SECONDS - 2
        # Every second between the first and the last slot fired, each exactly once.
        assert times == [times[0] + i for i in range(len(times))]
        run_ids = [run_id for _, run_id in slots]
        assert None not in run_ids
        assert len(set(run_ids)) == len(run_ids)
        # No run without its slot: every run in the database is one of these.
        assert await q.store.count_runs() == len(run_ids)
        state = (await q.store.schedule_states(["every-second"]))[1][0]
        assert state.last_slot_at == times[-1]
        assert state.last_run_id == run_ids[-1]


async def test_a_schedule_with_an_unknown_component_stops_the_start(
    runq_setup: RunqSetup,
) -> None:
    config = runq_setup.write_config(
        {"schedules": [EVERY_SECOND, {**EVERY_SECOND, "name": "b", "component": "task/nope"}]}
    )
    result = await runq_setup.cli("serve", config=config, timeout=30)
    assert result.returncode == 2, result.stderr
    assert "schedules[1].component" in result.stderr
    assert "task/nope" in result.stderr
