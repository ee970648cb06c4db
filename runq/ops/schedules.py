"""Schedules as operators see them: the configuration beside the fleet-wide state."""

from __future__ import annotations

import msgspec

from runq.config import ScheduleConfig
from runq.cron import Cron
from runq.model import ScheduleState


class ScheduleView(msgspec.Struct, frozen=True, kw_only=True):
    """One schedule as ``runq schedules list`` and ``GET /queue/schedules`` show it."""

    name: str
    cron: str
    timezone: str
    component: str
    overlap: str
    catch_up: str
    paused: bool
    paused_at: float | None
    #: When the next slot is due (None while paused).
    next_fire_at: float | None
    #: The latest recorded slot and the run it made (None: skipped by the overlap rule).
    last_fire_at: float | None
    last_run_id: str | None


def schedule_view(schedule: ScheduleConfig, state: ScheduleState, now: float) -> ScheduleView:
    """A configured schedule with its fleet-wide state, as of the database clock ``now``."""
    next_at = None if state.paused else Cron(schedule).next_after(max(state.cursor_at, now))
    return ScheduleView(
        name=schedule.name,
        cron=schedule.cron,
        timezone=schedule.timezone,
        component=schedule.component,
        overlap=schedule.overlap,
        catch_up=schedule.catch_up,
        paused=state.paused,
        paused_at=state.paused_at,
        next_fire_at=next_at,
        last_fire_at=state.last_slot_at,
        last_run_id=state.last_run_id,
    )
