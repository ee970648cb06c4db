"""``[budget]``: spending limits per user and configuration."""

from __future__ import annotations

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec

from runq.config.checks import require
from runq.errors import ConfigError

BUDGET_SCOPES = ("user", "configuration", "both")

BUDGET_PERIODS = ("day", "month")


class BudgetLimit(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    scope: str = "user"
    period: str = "day"
    max_cost: float | None = None
    max_tokens: int | None = None
    max_runs: int | None = None


class BudgetConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    timezone: str = "UTC"
    limits: tuple[BudgetLimit, ...] = ()


def validate_budget(b: BudgetConfig) -> None:
    try:
        ZoneInfo(b.timezone)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise ConfigError("budget.timezone", f"{b.timezone!r} is not a known IANA time zone") from e
    for i, limit in enumerate(b.limits):
        key = f"budget.limits[{i}]"
        require(
            limit.scope in BUDGET_SCOPES,
            f"{key}.scope",
            f"{limit.scope!r} is not one of {', '.join(BUDGET_SCOPES)}",
        )
        require(
            limit.period in BUDGET_PERIODS,
            f"{key}.period",
            f"{limit.period!r} is not one of {', '.join(BUDGET_PERIODS)}",
        )
        caps = (limit.max_cost, limit.max_tokens, limit.max_runs)
        require(
            any(c is not None for c in caps),
            key,
            "needs at least one of max_cost, max_tokens, max_runs",
        )
        for name, cap in zip(("max_cost", "max_tokens", "max_runs"), caps, strict=True):
            require(cap is None or cap >= 0, f"{key}.{name}", "must be >= 0")
