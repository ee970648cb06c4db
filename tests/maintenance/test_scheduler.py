"""Schedules in one process on both engines: catch-up after the fleet was down, daylight
saving, overlap and pauses. Time moves with the store's ``clock_offset_seconds`` (the
database clock every replica reads), never by sleeping."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from serve_harness import RunqSetup, runq_engine, runq_setup  # fixtures are used by name

from runq.config import ScheduleConfig
from runq.cron import Cron
from runq.maintenance.scheduler import Scheduler
from runq.store.base import Store

pytestmark = pytest.mark.anyio

_FIXTURES = (runq_engine, runq_setup)

BERLIN = ZoneInfo("Europe/Berlin")


def schedule(**over: Any) -> dict[str, Any]:
    base = {"name": "tick", "cron": "* * * * *", "component": "task/record"}
    return {**base, **over}


async def move_clock_to(store: Store, when: float) -> None:
    """Set the database clock (plus offset) to about ``when``."""
    store.clock_offset_seconds = 0.0
    store.clock_offset_seconds = when - await store.now()


async def slots_of(store: Store, name: str = "tick") -> list[tuple[float, str | None]]:
    return sorted(await store.recent_schedule_slots(name, limit=10_000))


def local(ts: float) -> str:
    return datetime.fromtimestamp(ts, BERLIN).isoformat()


# -- catch-up after downtime -----------------------------------------------------------------


@pytest.mark.parametrize(("catch_up", "fired_for_missed"), [("latest", 1), ("none", 0), ("all", 5)])
async def test_catch_up_after_the_fleet_was_down(
    runq_setup: RunqSetup, catch_up: str, fired_for_missed: int
) -> None:
    """A minutely schedule; the whole fleet stops for 30 minutes. On return, missed slots
    follow the rule (``all`` bounded by catch_up_max = 5) and the next slot fires on time."""
    config = {"schedules": [schedule(catch_up=catch_up, catch_up_max=5, grace_seconds=10)]}
    async with runq_setup.queue(config) as q:
        start = (await q.store.now() // 60) * 60 + 30  # half a minute past, so no slot is near
        await move_clock_to(q.store, start)
        replicas = [Scheduler(q.store, q.config) for _ in range(2)]
        assert (await replicas[0].run_once()).fired == 0  # first sight: counts from now
        await move_clock_to(q.store, start + 30 * 60)  # the fleet was away for 30 minutes
        reports = [await r.run_once() for r in replicas]
        assert sum(r.fired for r in reports) == fired_for_missed
        assert reports[1].fired == 0  # the second replica found every slot handled
        fired = await slots_of(q.store)
        assert len(fired) == fired_for_missed
        assert all(run_id is not None for _, run_id in fired)
        # Missed slots are the latest ones, each on a minute boundary before the return.
        assert all(slot % 60 == 0 and slot < start + 30 * 60 for slot, _ in fired)
        if fired:
            assert fired[-1][0] == start + 30 * 60 - 30
        assert await q.store.count_runs() == fired_for_missed
        # Back to normal: the next slot, a second after it is due, fires exactly once.
        await move_clock_to(q.store, start + 30 * 60 + 31)
        reports = [await r.run_once() for r in replicas]
        assert sum(r.fired for r in reports) == 1
        assert (await slots_of(q.store))[-1][0] == start + 30 * 60 + 30


async def test_on_time_slots_fire_even_when_a_pass_is_late(runq_setup: RunqSetup) -> None:
    """Slots within the grace are on time: none is lost when the pass comes late."""
    config = {"schedules": [schedule(cron="* * * * * *", catch_up="none", grace_seconds=5)]}
    async with runq_setup.queue(config) as q:
        start = float(int(await q.store.now())) + 0.5
        await move_clock_to(q.store, start)
        scheduler = Scheduler(q.store, q.config)
        await scheduler.run_once()
        await move_clock_to(q.store, start + 4)
        assert (await scheduler.run_once()).fired == 4
        await move_clock_to(q.store, start + 20)  # 16 s: 5 on time, 11 missed and dropped
        report = await scheduler.run_once()
        assert (report.fired, report.dropped) == (5, 11)


# -- daylight saving ------------------------------------------------------------------------


def test_cron_fires_a_skipped_hour_once_and_a_repeated_hour_once() -> None:
    daily = Cron(ScheduleConfig("d", "30 2 * * *", "task/record", timezone="Europe/Berlin"))
    spring = datetime(2026, 3, 28, 12, tzinfo=BERLIN).timestamp()
    slots = daily.after(spring, spring + 3 * 86400, 10)
    # 02:30 does not exist on 29 March: it fires once, at 03:00; then 02:30 as usual.
    assert [local(s) for s in slots] == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]
    autumn = datetime(2026, 10, 24, 12, tzinfo=BERLIN).timestamp()
    slots = daily.after(autumn, autumn + 2 * 86400, 10)
    # 02:30 happens twice on 25 October: it fires for the first one only.
    assert [local(s) for s in slots] == [
        "2026-10-25T02:30:00+02:00",
        "2026-10-26T02:30:00+01:00",
    ]
    every20 = Cron(ScheduleConfig("e", "*/20 * * * *", "task/record", timezone="Europe/Berlin"))
    night = datetime(2026, 10, 25, 1, 50, tzinfo=BERLIN).timestamp()
    slots = every20.after(night, night + 3 * 3600, 20)
    # The repeated hour 02:00-03:00 fires once: its second pass adds nothing.
    assert [local(s)[11:19] for s in slots] == [
        "02:00:00", "02:20:00", "02:40:00", "03:00:00", "03:20:00", "03:40:00",
    ]  # fmt: skip


async def test_dst_transitions_on_the_database_clock(runq_setup: RunqSetup) -> None:
    """The same rules through the store: the database clock moved across both
    transitions of a year in Europe/Berlin, catch-up "all" so every slot is kept."""
    config = {
        "queue": {"retention_seconds": 366 * 86400},  # keep every slot row of the year
        "schedules": [
            schedule(cron="30 2 * * *", timezone="Europe/Berlin", catch_up="all", catch_up_max=100)
        ],
    }
    async with runq_setup.queue(config) as q:
        scheduler = Scheduler(q.store, q.config)
        await move_clock_to(q.store, datetime(2026, 3, 28, 12, tzinfo=BERLIN).timestamp())
        await scheduler.run_once()
        await move_clock_to(q.store, datetime(2026, 3, 30, 12, tzinfo=BERLIN).timestamp())
        assert (await scheduler.run_once()).fired == 2
        await move_clock_to(q.store, datetime(2026, 10, 24, 12, tzinfo=BERLIN).timestamp())
        await scheduler.run_once()  # catches up the summer (bounded by catch_up_max)
        before = len(await slots_of(q.store))
        await move_clock_to(q.store, datetime(2026, 10, 26, 12, tzinfo=BERLIN).timestamp())
        assert (await scheduler.run_once()).fired == 2
        fired = await slots_of(q.store)
        assert len(fired) == before + 2
        assert [local(s) for s, _ in fired[:2]] == [
            "2026-03-29T03:00:00+02:00",
            "2026-03-30T02:30:00+02:00",
        ]
        assert [local(s) for s, _ in fired[-2:]] == [
            "2026-10-25T02:30:00+02:00",
            "2026-10-26T02:30:00+01:00",
        ]


# -- overlap and pauses ----------------------------------------------------------------------


async def test_overlap_skip_records_the_slot_without_a_run(runq_setup: RunqSetup) -> None:
    async with runq_setup.queue({"schedules": [schedule(overlap="skip")]}) as q:
        start = (await q.store.now() // 60) * 60 + 30
        await move_clock_to(q.store, start)
        scheduler = Scheduler(q.store, q.config)
        await scheduler.run_once()
        await move_clock_to(q.store, start + 31)
        assert (await scheduler.run_once()).fired == 1
        first = (await slots_of(q.store))[-1][1]
        assert first is not None
        await move_clock_to(q.store, start + 91)  # the first run is still queued
        report = await scheduler.run_once()
        assert (report.fired, report.skipped) == (0, 1)
        assert (await slots_of(q.store))[-1][1] is None
        await q.cancel(first)  # final now: the next slot fires again
        await move_clock_to(q.store, start + 151)
        assert (await scheduler.run_once()).fired == 1


async def test_pause_holds_every_replica_and_resume_does_not_catch_up(
    runq_setup: RunqSetup,
) -> None:
    async with runq_setup.queue({"schedules": [schedule(catch_up="all")]}) as q:
        start = (await q.store.now() // 60) * 60 + 30
        await move_clock_to(q.store, start)
        replicas = [Scheduler(q.store, q.config) for _ in range(2)]
        await replicas[0].run_once()
        state = await q.store.set_schedule_paused("tick", True)
        assert state.paused
        assert state.paused_at is not None
        await move_clock_to(q.store, start + 600)
        assert [(await r.run_once()).fired for r in replicas] == [0, 0]
        state = await q.store.set_schedule_paused("tick", False)
        assert not state.paused
        assert state.cursor_at >= start + 600 - 1
        assert [(await r.run_once()).fired for r in replicas] == [0, 0]  # no catch-up
        await move_clock_to(q.store, start + 631)
        assert sum([(await r.run_once()).fired for r in replicas]) == 1


async def test_slot_rows_are_kept_as_long_as_runs(runq_setup: RunqSetup) -> None:
    config = {"queue": {"retention_seconds": 120}, "schedules": [schedule(catch_up="none")]}
    async with runq_setup.queue(config) as q:
        start = (await q.store.now() // 60) * 60 + 30
        await move_clock_to(q.store, start)
        scheduler = Scheduler(q.store, q.config)
        await scheduler.run_once()
        for minute in range(4):  # a second after each of the next four slots
            await move_clock_to(q.store, start + 30 + minute * 60 + 1)
            assert (await scheduler.run_once()).fired == 1
        # Slots at start+30, +90, +150, +210; now is start+211: rows older than 120 s go.
        assert [s for s, _ in await slots_of(q.store)] == [start + 150, start + 210]
