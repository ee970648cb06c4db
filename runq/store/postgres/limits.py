"""Limits on PostgreSQL: pauses, the limits state claims read, usage and budgets."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from runq.ids import new_run_id
from runq.limits import LimitState, Pause, like_pattern, split_running
from runq.model import BudgetBlock, Lease, QueuedCount, UsageKey, UsageTotals
from runq.store import codec
from runq.store.postgres.base import (
    PostgresBase,
    blocked_params,
    clocks_and_running,
)


def _key_arrays(keys: Sequence[UsageKey]) -> tuple[list[str], list[str], list[float]]:
    return [k.scope for k in keys], [k.subject for k in keys], [k.period_start for k in keys]


class PostgresLimits(PostgresBase):
    """A group of ``Store`` verbs; ``PostgresStore`` composes the groups."""

    async def add_pause(
        self, kind: str, target: str, *, reason: str | None, created_by: str | None
    ) -> tuple[Pause, bool]:
        like = like_pattern(target) if kind == "component" else None
        row = await self._db.fetchone(
            self._sql.pause_insert, new_run_id(), kind, target, like, reason, created_by
        )
        return codec.pause_from_row(row), bool(row["created"])

    async def remove_pause(self, key: str, *, kind: str = "", target: str = "") -> Pause | None:
        found = await self._db.fetch(self._sql.pause_delete, key, kind, target)
        return codec.pause_from_row(found[0]) if found else None

    async def list_pauses(self) -> list[Pause]:
        return [
            codec.pause_from_row(r) for r in await self._db.fetch(self._sql.pause_list, retry=True)
        ]

    async def limits_state(self) -> LimitState:
        sql = self._sql

        async def read(con: asyncpg.Connection) -> tuple[list[asyncpg.Record], ...]:
            return (
                await con.fetch(sql.running_by_component),
                await con.fetch(sql.rate_windows_get, self.limits.patterns),
            )

        running_rows, stored = await self._db.in_transaction(read, verb="limits_state")
        now, _clock, found = clocks_and_running(running_rows)
        running, keys = split_running(found)
        windows = {r["pattern"]: (r["window_start"], r["used"]) for r in stored}
        return LimitState(now=now, running=running, windows=windows, keys=keys)

    async def session_ahead(self, run_id: str, session_id: str) -> bool:
        return bool(await self._db.fetchval(self._sql.session_ahead, run_id, session_id))

    async def queued_by_component(self, blocked: BudgetBlock | None = None) -> list[QueuedCount]:
        found = await self._db.fetch(
            self._sql.queued_by_component, *blocked_params(blocked), retry=True
        )
        return [QueuedCount(*r) for r in found]

    async def record_usage(
        self, worker_id: str, lease: Lease, *, tokens: int, cost: float, keys: Sequence[UsageKey]
    ) -> None:
        await self._db.fetch(
            self._sql.record_usage, *_key_arrays(keys), int(tokens), float(cost), lease.run_id
        )

    async def count_claimed_run(self, keys: Sequence[UsageKey]) -> None:
        if keys:
            await self._db.fetch(self._sql.count_claimed_run, *_key_arrays(keys))

    async def usage_totals(self, keys: Sequence[UsageKey]) -> dict[UsageKey, UsageTotals]:
        totals = {k: UsageTotals() for k in keys}
        if not keys:
            return totals
        found = await self._db.fetch(self._sql.usage_totals, *_key_arrays(keys), retry=True)
        for r in found:
            key = UsageKey(r["scope"], r["subject"], r["period_start"])
            totals[key] = UsageTotals(cost=r["cost"], tokens=r["tokens"], runs=r["runs"])
        return totals

    async def usage_in_periods(
        self, periods: Sequence[tuple[str, float]]
    ) -> dict[UsageKey, UsageTotals]:
        if not periods:
            return {}
        found = await self._db.fetch(
            self._sql.usage_in_periods,
            [scope for scope, _ in periods],
            [float(start) for _, start in periods],
            retry=True,
        )
        return {
            UsageKey(r["scope"], r["subject"], r["period_start"]): UsageTotals(
                cost=r["cost"], tokens=r["tokens"], runs=r["runs"]
            )
            for r in found
        }
