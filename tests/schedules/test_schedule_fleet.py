"""Schedules across real ``runq serve`` replicas on both engines: one run per slot for a
minute while replicas are SIGKILLed and restarted, the catch-up rule after the whole fleet
was down for 30 seconds, and a start refused for a schedule whose component does not
exist."""

from __future__ import annotations

import itertools
import time

import anyio
import pytest
from helpers import wait_for
from prometheus_client.parser import text_string_to_metric_families
from serve_harness import (  # fixtures are used by name
    RunqServer,
    RunqSetup,
    ServeFactory,
    runq_engine,
    runq_setup,
    serve_factory,
)

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

_FIXTURES = (runq_engine, runq_setup, serve_factory)

#: How long the fleet runs under kills; every slot in it must fire exactly once.
CHAOS_SECONDS = 60.0
KILL_EVERY_SECONDS = 3.0
#: How long the whole fleet is away before it comes back and catches up.
FLEET_DOWN_SECONDS = 30.0
GRACE_SECONDS = 5

EVERY_SECOND = {
    "name": "every-second",
    "cron": "* * * * * *",
    "component": "task/record",
    # With one replica down at a time a slot is never late by more than the grace, so a
    # slot missing from the record is a lost slot; after the fleet's outage, the rule
    # fires the latest missed slot and drops the rest (each dropped slot is a gap).
    "catch_up": "latest",
    "grace_seconds": GRACE_SECONDS,
}
CONFIG = {"queue": {"lock_grace_seconds": 3}, "schedules": [EVERY_SECOND]}


async def start_fleet(replicas: list[RunqServer]) -> None:
    """Start every replica at once, then wait until all are ready."""
    for replica in replicas:
        await replica.start(wait_ready=False)
    for replica in replicas:
        await replica.wait_ready()


async def missed_total(replica: RunqServer) -> float:
    text = (await replica.request("GET", "/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "runq_schedule_missed_total":
                return sample.value
    return 0.0


def gaps(times: list[float]) -> list[tuple[float, float]]:
    """(last slot before, first slot after) for every hole in a run of seconds."""
    return [(a, b) for a, b in itertools.pairwise(times) if b - a != 1]


@pytest.mark.timeout(240)  # a minute of chaos, half a minute down, and the starts
async def test_one_run_per_slot_under_kills_and_catch_up_after_the_fleet_was_down(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    replicas = [await serve_factory(CONFIG, wait_ready=False) for _ in range(3)]
    for replica in replicas:
        await replica.wait_ready()  # started together: each is a Python process coming up
    async with runq_setup.queue(CONFIG) as q:
        deadline = time.monotonic() + CHAOS_SECONDS
        victim = 0
        while time.monotonic() < deadline:
            await anyio.sleep(KILL_EVERY_SECONDS)  # the pace of the chaos, not a wait
            replicas[victim].kill()
            await replicas[victim].start()
            victim = (victim + 1) % len(replicas)

        # The whole fleet crashes at once and stays away.
        for replica in replicas:
            replica.kill()
        went_down = await q.store.now()
        await anyio.sleep(FLEET_DOWN_SECONDS)  # the length of the outage, not a wait
        came_back = await q.store.now()
        await start_fleet(replicas)

        async def fired_since_return() -> bool:
            slots = await q.store.recent_schedule_slots("every-second", limit=10_000)
            return max(slot for slot, _ in slots) >= came_back + 3

        await wait_for(fired_since_return, timeout=30, message="slots fire after the return")
        dropped = [await missed_total(replica) for replica in replicas]
        for replica in replicas:
            await replica.terminate()

        slots = sorted(await q.store.recent_schedule_slots("every-second", limit=10_000))
        times = [slot for slot, _ in slots]
        run_ids = [run_id for _, run_id in slots]
        assert None not in run_ids
        assert len(set(run_ids)) == len(run_ids)
        # No run without its slot: every run in the database is one of these.
        assert await q.store.count_runs() == len(run_ids)

        # Under kills, every second fired exactly once: the only hole is the outage.
        holes = gaps(times)
        assert len(holes) == 1, holes
        before, after = holes[0]
        assert times[0] <= went_down - CHAOS_SECONDS + 2, "the record covers the minute"
        assert went_down - 3 <= before <= went_down
        # catch_up = "latest": the newest slot that was already more than the grace late
        # when a replica came back fired (late); every slot before it in the outage was
        # dropped, and counted by the replica that dropped them.
        assert came_back <= after + GRACE_SECONDS + 1
        first_back = await q.get(run_ids[times.index(after)])
        assert first_back is not None
        assert first_back.created_at - after >= GRACE_SECONDS
        missing = after - before - 1
        assert missing >= FLEET_DOWN_SECONDS - GRACE_SECONDS - 2
        # One more when the fleet died between firing a slot and moving the cursor past it
        # (two statements): the returning pass counts that slot among the dropped.
        assert max(dropped) in (missing, missing + 1), (dropped, missing)
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
