"""A schedule's cron expression as whole-second epoch slots in its time zone (croniter).

Every replica computes the same numbers from the same configuration: the scheduler fires
the slots, and the operator's view shows when the next one is due.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from croniter import croniter

from runq.config import ScheduleConfig


class Cron:
    """One schedule's cron expression in its time zone, as whole-second epoch slots."""

    def __init__(self, schedule: ScheduleConfig) -> None:
        self.expression = schedule.cron
        self.zone = ZoneInfo(schedule.timezone)
        self.with_seconds = schedule.has_seconds

    def _iter(self, start: float) -> croniter:
        return croniter(
            self.expression,
            datetime.fromtimestamp(start, self.zone),
            second_at_beginning=self.with_seconds,
        )

    def _repeated(self, slot: float) -> bool:
        """True for a slot in the second pass of a repeated (fall-back) wall-clock hour."""
        local = datetime.fromtimestamp(slot, self.zone)
        return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()

    def after(self, start: float, until: float, limit: int) -> list[float]:
        """Slots in (start, until], oldest first, at most ``limit``."""
        it, found = self._iter(start), list[float]()
        while len(found) < limit:
            slot = float(round(it.get_next(float)))
            if slot > until:
                break
            if slot > start and not self._repeated(slot):
                found.append(slot)
        return found

    def before(self, end: float, floor: float, limit: int) -> list[float]:
        """The latest ``limit`` slots in (floor, end], oldest first."""
        if limit <= 0:
            return []
        # Start a hair after ``end`` so a slot exactly at ``end`` is included.
        it, found = self._iter(end + 0.5), list[float]()
        while len(found) < limit:
            slot = float(round(it.get_prev(float)))
            if slot <= floor:
                break
            if slot <= end and not self._repeated(slot):
                found.append(slot)
        return sorted(found)

    def next_after(self, start: float) -> float:
        return self.after(start, float("inf"), 1)[0]
