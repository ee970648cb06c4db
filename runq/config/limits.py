"""``[limits]``: per-component concurrency and rate limits, and their patterns."""

from __future__ import annotations

import re
from collections.abc import Mapping

import msgspec

from runq.config.checks import require
from runq.errors import ConfigError


class LimitConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[limits."pattern"]``: fleet-wide admission rules for the components it matches."""

    #: Runs of the matched components running at once across every replica.
    max_running: int | None = None
    #: Runs sharing one ``concurrency_key`` running at once (runs without a key are free).
    max_running_per_key: int | None = None
    #: Starts per period, ``"N/second"``, ``"N/minute"`` or ``"N/hour"``.
    rate: str | None = None


#: A component pattern as in ``[routing]`` and ``[limits]``: ``*``, ``type/*``, ``type/id``.
COMPONENT_PATTERN_RE = re.compile(r"^[a-z]+/(\*|[\w.\-*]+)$")

#: Seconds per rate period.
RATE_PERIODS = {"second": 1.0, "minute": 60.0, "hour": 3600.0}

_RATE_RE = re.compile(r"^\s*(\d+)\s*/\s*(second|minute|hour)\s*$")


def parse_rate(text: str) -> tuple[int, float]:
    """``"100/minute"`` → (100, 60.0); ValueError for anything else."""
    m = _RATE_RE.match(text)
    if m is None or int(m.group(1)) < 1:
        raise ValueError(f"{text!r} is not 'N/second', 'N/minute' or 'N/hour' with N >= 1")
    return int(m.group(1)), RATE_PERIODS[m.group(2)]


def is_component_pattern(pattern: str) -> bool:
    return pattern == "*" or bool(COMPONENT_PATTERN_RE.match(pattern))


def validate_limits(limits: Mapping[str, LimitConfig]) -> None:
    for pattern, limit in limits.items():
        key = f'limits."{pattern}"'
        require(is_component_pattern(pattern), key, "a pattern is '*', 'type/*' or 'type/id'")
        require(
            limit.max_running is not None
            or limit.max_running_per_key is not None
            or limit.rate is not None,
            key,
            "set max_running, max_running_per_key or rate",
        )
        for name in ("max_running", "max_running_per_key"):
            value = getattr(limit, name)
            require(
                value is None or 1 <= value <= 1_000_000,
                f"{key}.{name}",
                f"{value} must be between 1 and 1000000",
            )
        if limit.rate is not None:
            try:
                parse_rate(limit.rate)
            except ValueError as e:
                raise ConfigError(f"{key}.rate", str(e)) from e
