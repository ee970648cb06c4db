"""The budget gate: asked before the claim, never after.

A refusal after the claim would cost the run; so the claimers ask first, and a run whose
user or configuration is over a cap stays queued while the runs behind it go on. It is
claimed once the period resets (midnight, or the first of the month, in
``[budget] timezone``). The check narrows the loss and does not close it: two replicas
may both pass the check and spend the last of a budget together.

Counters live in the store's ``budget_usage`` table, one row per
``(scope:period, subject, period_start)``; the subject is the user id, the
configuration, or ``user\\x1fconfiguration`` for a limit of scope ``both``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Protocol, TypeVar
from zoneinfo import ZoneInfo

import msgspec

from runq.config import BudgetConfig, BudgetLimit
from runq.model import BudgetBlock, UsageKey, UsageTotals, WaitReason, wait_time


class UsageCounters(Protocol):
    """What the gate reads of a store (every ``runq.store`` engine provides it); a
    protocol of its own so the budget rules do not depend on the storage layer."""

    async def now(self) -> float: ...

    async def usage_totals(self, keys: Sequence[UsageKey]) -> dict[UsageKey, UsageTotals]: ...

    async def usage_in_periods(
        self, periods: Sequence[tuple[str, float]]
    ) -> dict[UsageKey, UsageTotals]: ...


PAIR_SEPARATOR = "\x1f"
#: How long a computed block is reused; claims are frequent, budgets change slowly.
CACHE_SECONDS = 1.0


class BudgetLeft(msgspec.Struct, frozen=True, kw_only=True):
    """What is left under the tightest applicable limit (None = that kind is not capped)."""

    cost: float | None = None
    tokens: int | None = None
    runs: int | None = None

    @property
    def exhausted(self) -> bool:
        return any(v is not None and v <= 0 for v in (self.cost, self.tokens, self.runs))


def counter_scope(limit: BudgetLimit) -> str:
    return f"{limit.scope}:{limit.period}"


def subject_for(limit: BudgetLimit, user_id: str | None, configuration: str | None) -> str:
    user, conf = user_id or "", configuration or ""
    if limit.scope == "user":
        return user
    if limit.scope == "configuration":
        return conf
    return f"{user}{PAIR_SEPARATOR}{conf}"


def period_start(period: str, now: float, tz: ZoneInfo) -> float:
    """Epoch seconds of the current day's (or month's) local midnight."""
    local = datetime.fromtimestamp(now, tz)
    start = local.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "month":
        start = start.replace(day=1)
    return start.timestamp()


def period_end(period: str, now: float, tz: ZoneInfo) -> float:
    """Epoch seconds of the next local midnight (or first of the next month): when the
    counters of the current period stop counting. Built from the local date, not by adding
    24 hours, so a day with a daylight-saving change ends at its real midnight."""
    start = datetime.fromtimestamp(period_start(period, now, tz), tz)
    if period == "month":
        year, month = (start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1)
        return datetime(year, month, 1, tzinfo=tz).timestamp()
    following = start.date() + timedelta(days=1)
    return datetime(following.year, following.month, following.day, tzinfo=tz).timestamp()


def describe_subject(limit: BudgetLimit, user_id: str | None, configuration: str | None) -> str:
    """The counter's subject in words, as an operator reads it in a wait reason."""
    user, conf = user_id or "(none)", configuration or "(none)"
    if limit.scope == "user":
        return f"user {user}"
    if limit.scope == "configuration":
        return f"configuration {conf}"
    return f"user {user} with configuration {conf}"


def _spent(limit: BudgetLimit, totals: UsageTotals, cap: str) -> str:
    if cap == "cost":
        return f"cost {totals.cost:g}/{limit.max_cost:g}"
    if cap == "tokens":
        return f"tokens {totals.tokens}/{limit.max_tokens}"
    return f"runs {totals.runs}/{limit.max_runs}"


def over_cap(limit: BudgetLimit, totals: UsageTotals) -> str | None:
    """The reason a counter is at or over its cap (cost, tokens, runs), or None."""
    if limit.max_cost is not None and totals.cost >= limit.max_cost:
        return "cost"
    if limit.max_tokens is not None and totals.tokens >= limit.max_tokens:
        return "tokens"
    if limit.max_runs is not None and totals.runs >= limit.max_runs:
        return "runs"
    return None


class BudgetGate:
    def __init__(
        self,
        config: BudgetConfig,
        store: UsageCounters,
        *,
        on_refusal: Callable[[str], None] | None = None,
    ) -> None:
        self.limits = config.limits
        self.tz = ZoneInfo(config.timezone)
        self.store = store
        self._on_refusal = on_refusal
        self._cached: tuple[float, BudgetBlock] | None = None
        self._refused: set[tuple[str, str, float]] = set()

    @property
    def enabled(self) -> bool:
        return bool(self.limits)

    @property
    def caps_runs(self) -> bool:
        """Some limit counts runs, so a claim must be counted before the next one is made."""
        return any(limit.max_runs is not None for limit in self.limits)

    def key_of(
        self, limit: BudgetLimit, user_id: str | None, configuration: str | None, now: float
    ) -> UsageKey:
        """The counter ``limit`` reads for this user/configuration in the period at ``now``."""
        return UsageKey(
            counter_scope(limit),
            subject_for(limit, user_id, configuration),
            period_start(limit.period, now, self.tz),
        )

    def usage_keys(
        self, user_id: str | None, configuration: str | None, now: float
    ) -> list[UsageKey]:
        keys = {self.key_of(limit, user_id, configuration, now) for limit in self.limits}
        return sorted(keys, key=lambda k: (k.scope, k.subject))

    def invalidate(self) -> None:
        """Forget the cached block (after usage was recorded)."""
        self._cached = None

    async def blocked(self) -> BudgetBlock:
        """Who may not be claimed now. Empty (and no query) when no limits are configured."""
        if not self.limits:
            return BudgetBlock()
        cached = self._cached
        if cached is not None and time.monotonic() - cached[0] < CACHE_SECONDS:
            return cached[1]
        block = await self._compute()
        self._cached = (time.monotonic(), block)
        return block

    async def _compute(self) -> BudgetBlock:
        now = await self.store.now()
        periods = {
            (counter_scope(lim), period_start(lim.period, now, self.tz)) for lim in self.limits
        }
        totals = await self.store.usage_in_periods(sorted(periods))
        users: set[str] = set()
        configurations: set[str] = set()
        pairs: set[tuple[str, str]] = set()
        for limit in self.limits:
            scope, start = counter_scope(limit), period_start(limit.period, now, self.tz)
            for key, total in totals.items():
                if key.scope != scope or key.period_start != start:
                    continue
                reason = over_cap(limit, total)
                if reason is None:
                    continue
                self._note_refusal(key, reason)
                if limit.scope == "user":
                    users.add(key.subject)
                elif limit.scope == "configuration":
                    configurations.add(key.subject)
                else:
                    user, _, conf = key.subject.partition(PAIR_SEPARATOR)
                    pairs.add((user, conf))
        return BudgetBlock(
            users=frozenset(users), configurations=frozenset(configurations), pairs=frozenset(pairs)
        )

    def _note_refusal(self, key: UsageKey, reason: str) -> None:
        # Count a subject once per period when it becomes blocked, not once per claim pass.
        marker = (key.scope, key.subject, key.period_start)
        if marker not in self._refused:
            self._refused.add(marker)
            if self._on_refusal is not None:
                self._on_refusal(reason)

    async def hold(self, user_id: str | None, configuration: str | None) -> WaitReason | None:
        """Why the claim skips this user's (or configuration's) runs now: the first limit,
        in configuration order, whose counter is at its cap; None when none is. The same
        rule as ``blocked``, read for one run's counters (one query)."""
        if not self.limits:
            return None
        now = await self.store.now()
        totals = await self.store.usage_totals(self.usage_keys(user_id, configuration, now))
        for limit in self.limits:
            key = self.key_of(limit, user_id, configuration, now)
            used = totals.get(key, UsageTotals())
            cap = over_cap(limit, used)
            if cap is None:
                continue
            until = period_end(limit.period, now, self.tz)
            return WaitReason(
                kind="budget",
                pattern=key.scope,
                until=until,
                message=f"budget {key.scope} of {describe_subject(limit, user_id, configuration)}"
                f" exhausted ({_spent(limit, used, cap)}) until {wait_time(until)}",
            )
        return None

    async def left(self, user_id: str | None, configuration: str | None) -> BudgetLeft | None:
        """What is left for this user/configuration under the tightest limit; None if unlimited."""
        if not self.limits:
            return None
        now = await self.store.now()
        keys = self.usage_keys(user_id, configuration, now)
        totals = await self.store.usage_totals(keys)
        cost: float | None = None
        tokens: int | None = None
        runs: int | None = None
        for limit in self.limits:
            key = self.key_of(limit, user_id, configuration, now)
            used = totals.get(key, UsageTotals())
            if limit.max_cost is not None:
                cost = _tighter(cost, limit.max_cost - used.cost)
            if limit.max_tokens is not None:
                tokens = _tighter(tokens, limit.max_tokens - used.tokens)
            if limit.max_runs is not None:
                runs = _tighter(runs, limit.max_runs - used.runs)
        return BudgetLeft(cost=cost, tokens=tokens, runs=runs)


_N = TypeVar("_N", int, float)


def _tighter(current: _N | None, candidate: _N) -> _N:
    return candidate if current is None or candidate < current else current
