"""Limit groups and the room each has left, computed the same way on both engines."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from runq.config import Config, LimitConfig, is_component_pattern, parse_rate

#: Room for a group with no cap of that kind: more than any claim asks for.
NO_CAP = 1_000_000_000


def pattern_specificity(pattern: str) -> tuple[int, int]:
    """Sort key, most specific first: exact names, then globs by their literal length, then
    ``*``. Shared with ``[routing]`` so a pattern means the same thing in both sections."""
    if pattern == "*":
        return (2, 0)
    if "*" not in pattern:
        return (0, -len(pattern))
    return (1, -len(pattern.replace("*", "")))


def like_pattern(pattern: str) -> str:
    """The SQL LIKE form of a component pattern (``ESCAPE '\\'``); ``*`` is the only
    wildcard a pattern may hold, and LIKE's own wildcards are escaped."""
    escaped = pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%")


def rate_window(now: float, period: float) -> float:
    """Start of the fixed window holding ``now``: windows are aligned to the epoch, so every
    replica and every reader agrees on them without coordination."""
    return math.floor(now / period) * period


@dataclass(frozen=True, slots=True)
class GroupRule:
    pattern: str
    max_running: int | None
    max_running_per_key: int | None
    rate: tuple[int, float] | None  # (starts, period seconds)

    @classmethod
    def from_limit(cls, pattern: str, limit: LimitConfig) -> GroupRule:
        return cls(
            pattern=pattern,
            max_running=limit.max_running,
            max_running_per_key=limit.max_running_per_key,
            rate=parse_rate(limit.rate) if limit.rate is not None else None,
        )


@dataclass(frozen=True)
class LimitRules:
    """The ``[limits]`` of one process, patterns in match order."""

    groups: tuple[GroupRule, ...] = ()
    _cache: dict[str, int | None] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_config(cls, config: Config) -> LimitRules:
        return cls.from_limits(config.limits)

    @classmethod
    def from_limits(cls, limits: Mapping[str, LimitConfig]) -> LimitRules:
        ordered = sorted(limits, key=pattern_specificity)
        return cls(tuple(GroupRule.from_limit(p, limits[p]) for p in ordered))

    @property
    def enabled(self) -> bool:
        return bool(self.groups)

    @property
    def patterns(self) -> list[str]:
        return [g.pattern for g in self.groups]

    @property
    def like_patterns(self) -> list[str]:
        return [like_pattern(g.pattern) for g in self.groups]

    @property
    def has_rates(self) -> bool:
        return any(g.rate is not None for g in self.groups)

    @property
    def has_key_limits(self) -> bool:
        return any(g.max_running_per_key is not None for g in self.groups)

    def group_of(self, component: str) -> int | None:
        """Index of the most specific pattern matching ``component`` (``type/id``)."""
        if component in self._cache:
            return self._cache[component]
        found = None
        for i, g in enumerate(self.groups):
            if g.pattern == "*" or fnmatch.fnmatchcase(component, g.pattern):
                found = i
                break
        self._cache[component] = found
        return found

    def running_by_group(self, running: Iterable[tuple[str, int]]) -> list[int]:
        """``(component, running count)`` pairs → running count per group."""
        counts = [0] * len(self.groups)
        for component, n in running:
            i = self.group_of(component)
            if i is not None:
                counts[i] += n
        return counts

    def max_running_caps(self) -> list[int]:
        """Each group's ``max_running`` (``NO_CAP`` where it has none)."""
        return [g.max_running or NO_CAP for g in self.groups]

    def rate_caps(self) -> list[int]:
        """Each group's starts per rate window (``NO_CAP`` where it has no rate)."""
        return [g.rate[0] if g.rate is not None else NO_CAP for g in self.groups]

    def rate_periods(self) -> list[float]:
        """Each group's rate window in seconds (1 where it has no rate: never read)."""
        return [g.rate[1] if g.rate is not None else 1.0 for g in self.groups]

    def per_key_max(self) -> list[int]:
        """Each group's ``max_running_per_key`` (``NO_CAP`` where it has none)."""
        return [g.max_running_per_key or NO_CAP for g in self.groups]

    def key_running(
        self, running: Iterable[tuple[str, str | None, int]]
    ) -> list[tuple[int, str, int]]:
        """``(component, concurrency key, running count)`` rows → (group, key, running) for
        the groups with a per-key limit."""
        acc: dict[tuple[int, str], int] = {}
        for component, key, n in running:
            if key is None:
                continue
            i = self.group_of(component)
            if i is None or self.groups[i].max_running_per_key is None:
                continue
            acc[(i, key)] = acc.get((i, key), 0) + n
        return [(i, key, n) for (i, key), n in acc.items()]

    def rate_used(self, now: float, windows: Mapping[str, tuple[float, int]]) -> list[int]:
        """Starts already counted in each group's current window (``windows``: pattern →
        (window start, starts) as stored)."""
        used = [0] * len(self.groups)
        for i, g in enumerate(self.groups):
            if g.rate is None:
                continue
            stored = windows.get(g.pattern)
            if stored is not None and stored[0] == rate_window(now, g.rate[1]):
                used[i] = stored[1]
        return used

    def crosses_window(self, then: float, now: float) -> bool:
        """True when some rate window ended between ``then`` and ``now``: starts stamped
        ``then`` would be counted into a window already gone."""
        return any(
            g.rate is not None and rate_window(then, g.rate[1]) != rate_window(now, g.rate[1])
            for g in self.groups
        )

    def room(self, running: list[int], rate_used: list[int]) -> list[int]:
        """Runs each group may still start now: the tighter of its limits."""
        rooms = []
        for i, g in enumerate(self.groups):
            room = NO_CAP
            if g.max_running is not None:
                room = min(room, g.max_running - running[i])
            if g.rate is not None:
                room = min(room, g.rate[0] - rate_used[i])
            rooms.append(max(room, 0))
        return rooms

    def started(self, now: float, components: Iterable[str]) -> dict[str, tuple[float, int]]:
        """Starts to add to the rate windows for the runs just claimed: pattern → (window
        start, starts)."""
        bumps: dict[str, tuple[float, int]] = {}
        for component in components:
            i = self.group_of(component)
            if i is None:
                continue
            g = self.groups[i]
            if g.rate is None:
                continue
            start = rate_window(now, g.rate[1])
            bumps[g.pattern] = (start, bumps.get(g.pattern, (start, 0))[1] + 1)
        return bumps


@dataclass(frozen=True)
class LimitState:
    """What the limits look at, read in one pass: the database clock, running runs per
    component and the stored rate windows (pattern → (window start, starts))."""

    now: float
    running: dict[str, int]
    windows: dict[str, tuple[float, int]]
    #: Running runs per (component, concurrency key), runs with a key only.
    keys: dict[tuple[str, str], int] = field(default_factory=dict)


def split_running(
    rows: Iterable[tuple[str, str | None, int]],
) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """Running counts per component, and per (component, key) for runs with a key."""
    by_component: dict[str, int] = {}
    by_key: dict[tuple[str, str], int] = {}
    for component, key, n in rows:
        by_component[component] = by_component.get(component, 0) + n
        if key is not None:
            by_key[(component, key)] = by_key.get((component, key), 0) + n
    return by_component, by_key


PAUSE_KINDS = ("component", "deployment")
#: Longest pause target and reason accepted (both are operator text shown back verbatim).
MAX_PAUSE_TARGET_CHARS = 200
MAX_PAUSE_REASON_CHARS = 1000


def pause_target_problem(kind: str, target: str) -> str | None:
    """Why (``kind``, ``target``) cannot be paused, or None when it can."""
    if kind not in PAUSE_KINDS:
        return f"kind must be one of {', '.join(PAUSE_KINDS)}"
    if not target or len(target) > MAX_PAUSE_TARGET_CHARS:
        return f"the {kind} must be 1 to {MAX_PAUSE_TARGET_CHARS} characters"
    if kind == "component" and not is_component_pattern(target):
        return f"{target!r} is not a component pattern ('*', 'type/*' or 'type/id')"
    return None
