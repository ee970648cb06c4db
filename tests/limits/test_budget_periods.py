"""Budget arithmetic that needs no database: periods and caps."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

from runq.config import BudgetLimit
from runq.limits.budget import over_cap, period_end, period_start, subject_for
from runq.model import UsageTotals


def test_day_period_starts_at_local_midnight() -> None:
    tz = ZoneInfo("Europe/Berlin")
    now = datetime(2026, 3, 10, 0, 30, tzinfo=tz).timestamp()
    assert period_start("day", now, tz) == datetime(2026, 3, 10, tzinfo=tz).timestamp()
    # 23:30 UTC on the 9th is already the 10th in Berlin.
    now_utc = datetime(2026, 3, 9, 23, 30, tzinfo=ZoneInfo("UTC")).timestamp()
    assert period_start("day", now_utc, tz) == datetime(2026, 3, 10, tzinfo=tz).timestamp()


def test_month_period_starts_on_the_first() -> None:
    tz = ZoneInfo("UTC")
    now = datetime(2026, 11, 30, 18, 0, tzinfo=tz).timestamp()
    assert period_start("month", now, tz) == datetime(2026, 11, 1, tzinfo=tz).timestamp()


def test_caps_are_reached_at_the_limit() -> None:
    limit = BudgetLimit(scope="user", period="day", max_cost=1.0, max_tokens=100, max_runs=3)
    assert over_cap(limit, UsageTotals(runs=2)) is None
    assert over_cap(limit, UsageTotals(runs=3)) == "runs"
    assert over_cap(limit, UsageTotals(tokens=100)) == "tokens"
    assert over_cap(limit, UsageTotals(cost=1.5)) == "cost"


def test_subjects_per_scope() -> None:
    assert subject_for(BudgetLimit(scope="user", max_runs=1), "u1", "c1") == "u1"
    assert subject_for(BudgetLimit(scope="configuration", max_runs=1), "u1", "c1") == "c1"
    assert subject_for(BudgetLimit(scope="both", max_runs=1), None, "c1") == "\x1fc1"


def test_a_period_ends_at_the_next_local_midnight_or_first_of_the_month() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    # The day the clocks go forward is 23 hours long; it still ends at local midnight.
    now = datetime(2026, 3, 29, 12, 0, tzinfo=berlin).timestamp()
    assert period_end("day", now, berlin) == datetime(2026, 3, 30, tzinfo=berlin).timestamp()
    utc = ZoneInfo("UTC")
    december = datetime(2026, 12, 31, 23, 59, tzinfo=utc).timestamp()
    assert period_end("month", december, utc) == datetime(2027, 1, 1, tzinfo=utc).timestamp()
    assert period_end("month", now, berlin) == datetime(2026, 4, 1, tzinfo=berlin).timestamp()
