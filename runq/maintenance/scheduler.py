"""The scheduler: turns ``[[schedules]]`` cron slots into runs, once per slot across a fleet.

Every replica runs it. Each pass reads the database clock and every schedule's row (paused,
cursor = up to where slots were handled), works out the slots due since the cursor, and
fires each with ``store.fire_schedule_slot``: one transaction that records the slot under
the primary key (schedule, slot time) and inserts its run. Whichever replica is first
records the slot; the others record nothing and make no run. A replica killed mid-insert
rolls back both halves, and the next pass of any replica fires the slot again.

Slots are whole seconds computed by croniter in the schedule's time zone, so every replica
computes the same numbers. Daylight saving: a slot in a skipped hour fires once at the
first valid time after it (croniter moves it there); in a repeated hour only the first pass
fires (slots whose wall-clock time comes round a second time are dropped).

Catch-up after downtime: a slot at most ``grace_seconds`` late is on time and fires. Older
ones were missed; ``catch_up`` says what to do: "latest" fires the most recent missed slot,
"none" drops them all, "all" fires the most recent ``catch_up_max`` of them. Dropped slots
are counted (``runq_schedule_missed_total``) and the cursor moves past them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runq.components import ComponentRegistry
from runq.config import Config, ScheduleConfig
from runq.cron import Cron
from runq.errors import ConfigError
from runq.log import get_logger
from runq.loops import SERVICE_BACKOFF, Retry, run_periodically
from runq.metrics import (
    SCHEDULE_FIRED,
    SCHEDULE_LAST_FIRE,
    SCHEDULE_MISSED,
    SCHEDULE_NEXT_FIRE,
    SCHEDULE_SKIPPED,
)
from runq.model import NewRun, ScheduleState
from runq.store.base import Store

log = get_logger(__name__)

#: At most this many on-time slots per schedule and pass (a cron every second with a long
#: grace would otherwise make one pass walk a huge range).
MAX_ON_TIME_SLOTS = 1000
#: At most this many missed slots are counted per schedule and pass.
MAX_COUNTED_MISSED = 1000
#: The pass after the earliest next slot comes this much later, so the slot is due by then.
SLOT_LAG_SECONDS = 0.01
MIN_SLEEP_SECONDS = 0.05


def check_schedule_components(config: Config, components: ComponentRegistry) -> None:
    """Refuse to start with a schedule whose component this process cannot run."""
    for i, schedule in enumerate(config.schedules):
        if not components.knows(schedule.component_type, schedule.component_id):
            raise ConfigError(
                f"schedules[{i}].component",
                f"unknown component {schedule.component!r} (schedule {schedule.name!r}); "
                "define it under [components]",
            )


@dataclass(frozen=True)
class Plan:
    """What one pass does with one schedule's due slots."""

    fire: list[float]
    #: Missed slots dropped by the catch-up rule (counted only).
    dropped: int
    #: Move the cursor here (every slot up to it was handled).
    cursor: float


def plan_slots(schedule: ScheduleConfig, cron: Cron, cursor: float, now: float) -> Plan:
    """The slots due in (cursor, now] and which of them fire, by the catch-up rule."""
    on_time_from = max(cursor, now - schedule.grace_seconds)
    on_time = cron.after(on_time_from, now, MAX_ON_TIME_SLOTS)
    missed_end = now - schedule.grace_seconds
    wanted = {"none": 0, "latest": 1, "all": schedule.catch_up_max}[schedule.catch_up]
    missed: list[float] = []
    dropped = 0
    if missed_end > cursor:
        missed = cron.before(missed_end, cursor, wanted)
        # Counted for the metric, bounded: a long outage of a frequent schedule must not
        # make one pass walk every slot it missed.
        dropped = max(len(cron.after(cursor, missed_end, MAX_COUNTED_MISSED)) - len(missed), 0)
    # Every slot up to the newest on-time one was handled: fired now, or missed and
    # either fired or dropped by the rule.
    handled_to = max([cursor, missed_end, *on_time[-1:]])
    return Plan(fire=missed + on_time, dropped=dropped, cursor=handled_to)


@dataclass
class SchedulerReport:
    fired: int = 0
    skipped: int = 0
    duplicates: int = 0
    dropped: int = 0
    #: Seconds until the earliest next slot of an unpaused schedule (None: no schedules).
    next_in: float | None = None
    fired_runs: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "fired": self.fired,
            "skipped": self.skipped,
            "duplicates": self.duplicates,
            "dropped": self.dropped,
        }


class Scheduler:
    def __init__(self, store: Store, config: Config, *, max_sleep: float | None = None) -> None:
        self.store = store
        self.config = config
        self.schedules = {s.name: s for s in config.schedules}
        self.crons = {s.name: Cron(s) for s in config.schedules}
        self.max_sleep = max_sleep if max_sleep is not None else config.queue.poll_interval

    def _new_run(self, schedule: ScheduleConfig, slot_at: float) -> NewRun:
        return NewRun(
            component_type=schedule.component_type,
            component_id=schedule.component_id,
            payload=schedule.payload,
            max_attempts=schedule.max_attempts or self.config.queue.max_attempts,
            deployment_id=schedule.deployment_id or None,
            priority=schedule.priority,
            origin="schedule",
        )

    async def run_once(self) -> SchedulerReport:
        """One pass over every schedule; returns what it did."""
        report = SchedulerReport()
        if not self.schedules:
            return report
        now, states = await self.store.schedule_states(list(self.schedules))
        for state in states:
            await self._handle(state, now, report)
        return report

    async def _handle(self, state: ScheduleState, now: float, report: SchedulerReport) -> None:
        schedule, cron = self.schedules[state.name], self.crons[state.name]
        if state.last_slot_at is not None:
            SCHEDULE_LAST_FIRE.labels(schedule=state.name).set(state.last_slot_at)
        if state.paused:
            # +Inf: "not due", so an alert on an overdue next slot stays quiet while paused.
            SCHEDULE_NEXT_FIRE.labels(schedule=state.name).set(float("inf"))
            return
        plan = plan_slots(schedule, cron, state.cursor_at, now)
        for slot in plan.fire:
            await self._fire(schedule, slot, report)
        if plan.dropped:
            report.dropped += plan.dropped
            SCHEDULE_MISSED.labels(schedule=state.name).inc(plan.dropped)
            log.warning("schedule.missed", schedule=state.name, dropped=plan.dropped)
        if plan.cursor > state.cursor_at:
            await self.store.advance_schedule_cursor(state.name, plan.cursor)
            # Slot rows are history once behind the cursor; keep them as long as runs.
            await self.store.prune_schedule_slots(
                state.name, before=now - self.config.queue.retention_seconds
            )
        next_at = cron.next_after(max(plan.cursor, now))
        SCHEDULE_NEXT_FIRE.labels(schedule=state.name).set(next_at)
        wait = max(next_at - now, 0.0)
        report.next_in = wait if report.next_in is None else min(report.next_in, wait)

    async def _fire(self, schedule: ScheduleConfig, slot: float, report: SchedulerReport) -> None:
        fired = await self.store.fire_schedule_slot(
            schedule.name,
            slot,
            self._new_run(schedule, slot),
            skip_if_running=schedule.overlap == "skip",
        )
        if not fired.recorded:
            report.duplicates += 1  # another replica was first
            return
        SCHEDULE_LAST_FIRE.labels(schedule=schedule.name).set(slot)
        if fired.run_id is None:
            report.skipped += 1
            SCHEDULE_SKIPPED.labels(schedule=schedule.name).inc()
            log.info("schedule.skipped", schedule=schedule.name, slot_at=slot)
            return
        report.fired += 1
        report.fired_runs.append(fired.run_id)
        SCHEDULE_FIRED.labels(schedule=schedule.name).inc()
        log.info("schedule.fired", schedule=schedule.name, slot_at=slot, run_id=fired.run_id)

    def _sleep_after(self, report: SchedulerReport) -> float:
        if report.next_in is None:
            return self.max_sleep
        return min(max(report.next_in + SLOT_LAG_SECONDS, MIN_SLEEP_SECONDS), self.max_sleep)

    async def run(self) -> None:
        """Pass after pass until cancelled: each sleeps until the next slot is due (at most
        ``max_sleep``, so a resume or a peer's progress is seen soon). A failed pass is
        logged and retried with backoff; cancellation is never swallowed."""
        if not self.schedules:
            return
        retry = Retry(
            SERVICE_BACKOFF,
            metric="scheduler",
            event="scheduler.pass_failed",
            log_delay=False,
            ceiling=self.max_sleep,
        )
        await run_periodically(self.run_once, retry=retry, interval=self._sleep_after)
