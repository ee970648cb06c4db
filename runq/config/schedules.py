"""``[[schedules]]``: recurring runs."""

from __future__ import annotations

import math
import re
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec
from croniter import croniter

from runq.config.checks import require
from runq.errors import ConfigError
from runq.model import COMPONENT_TYPES

SCHEDULE_OVERLAPS = ("allow", "skip")

SCHEDULE_CATCH_UPS = ("latest", "none", "all")

_SCHEDULE_NAME_RE = re.compile(r"^[A-Za-z0-9][\w.\-]{0,99}$")


class ScheduleConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One ``[[schedules]]`` entry: submit a run of ``component`` at every cron slot."""

    name: str
    #: Five fields (minute precision) or six with seconds first.
    cron: str
    component: str
    timezone: str = "UTC"
    payload: Any = None
    priority: int = 0
    max_attempts: int | None = None
    deployment_id: str = ""
    #: "skip": no run for a slot while the schedule's previous run is not final.
    overlap: str = "allow"
    #: Slots missed by more than ``grace_seconds`` (the fleet was down): "latest" fires the
    #: most recent one, "none" drops them, "all" fires up to ``catch_up_max`` of them.
    catch_up: str = "latest"
    catch_up_max: int = 10
    #: A slot this late still counts as on time and fires whatever ``catch_up`` says.
    grace_seconds: float = 10.0

    @property
    def has_seconds(self) -> bool:
        return len(self.cron.split()) == 6

    @property
    def component_type(self) -> str:
        return self.component.partition("/")[0]

    @property
    def component_id(self) -> str:
        return self.component.partition("/")[2]


def validate_schedules(schedules: tuple[ScheduleConfig, ...]) -> None:
    """Each ``[[schedules]]`` entry on its own; whether its component exists is checked at
    start, where the component registry is known."""
    seen: set[str] = set()
    for i, sch in enumerate(schedules):
        key = f"schedules[{i}]"
        require(
            bool(_SCHEDULE_NAME_RE.match(sch.name)),
            f"{key}.name",
            f"{sch.name[:100]!r} must be 1-100 letters, digits, '_', '-' or '.'",
        )
        require(sch.name not in seen, f"{key}.name", f"{sch.name!r} is used twice")
        seen.add(sch.name)
        fields = len(sch.cron.split())
        require(
            fields in (5, 6) and croniter.is_valid(sch.cron, second_at_beginning=fields == 6),
            f"{key}.cron",
            f"{sch.cron[:100]!r} is not a cron expression of five fields"
            " (or six with seconds first)",
        )
        try:
            ZoneInfo(sch.timezone)
        except (ZoneInfoNotFoundError, ValueError) as e:
            raise ConfigError(
                f"{key}.timezone", f"{sch.timezone[:100]!r} is not a known IANA time zone"
            ) from e
        ctype, sep, cid = sch.component.partition("/")
        require(
            bool(sep and cid) and ctype in COMPONENT_TYPES,
            f"{key}.component",
            f"a component is 'type/id' with type one of {', '.join(sorted(COMPONENT_TYPES))}",
        )
        require(
            sch.overlap in SCHEDULE_OVERLAPS,
            f"{key}.overlap",
            f"{sch.overlap!r} is not one of {', '.join(SCHEDULE_OVERLAPS)}",
        )
        require(
            sch.catch_up in SCHEDULE_CATCH_UPS,
            f"{key}.catch_up",
            f"{sch.catch_up!r} is not one of {', '.join(SCHEDULE_CATCH_UPS)}",
        )
        require(1 <= sch.catch_up_max <= 1000, f"{key}.catch_up_max", "must be between 1 and 1000")
        require(
            # Below a second, a pass that is a little late would count an on-time slot
            # as missed.
            math.isfinite(sch.grace_seconds) and sch.grace_seconds >= 1,
            f"{key}.grace_seconds",
            "must be a finite number >= 1",
        )
        require(
            sch.max_attempts is None or sch.max_attempts >= 1,
            f"{key}.max_attempts",
            "must be >= 1",
        )
        require(
            len(sch.deployment_id) <= 200, f"{key}.deployment_id", "must be at most 200 characters"
        )
