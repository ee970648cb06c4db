"""Limits on SQLite: pauses, the limits state claims read, usage and budgets."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from runq.ids import new_run_id
from runq.limits import LimitState, Pause, split_running
from runq.model import BudgetBlock, Lease, QueuedCount, UsageKey, UsageTotals
from runq.store import codec
from runq.store.sqlite.base import SqliteBase, blocked_params, json_encoder
from runq.store.sqlite.connection import Row


class SqliteLimits(SqliteBase):
    """A group of ``Store`` verbs; ``SqliteStore`` composes the groups."""

    async def add_pause(
        self, kind: str, target: str, *, reason: str | None, created_by: str | None
    ) -> tuple[Pause, bool]:
        def body(conn: sqlite3.Connection, now: float) -> tuple[Row, bool]:
            q = self._sql
            made = conn.execute(
                q.pause_insert, (new_run_id(), kind, target, reason, created_by, now)
            ).rowcount
            row: Row = conn.execute(q.pause_get, (kind, target)).fetchone()
            return row, made > 0

        row, created = await self._write(body)
        return codec.pause_from_row(row), created

    async def remove_pause(self, key: str, *, kind: str = "", target: str = "") -> Pause | None:
        def body(conn: sqlite3.Connection, now: float) -> list[Row]:
            return conn.execute(self._sql.pause_delete, (key, kind, target)).fetchall()

        found = await self._write(body)
        return codec.pause_from_row(found[0]) if found else None

    async def list_pauses(self) -> list[Pause]:
        def body(conn: sqlite3.Connection, now: float) -> list[Row]:
            return conn.execute(self._sql.pause_list).fetchall()

        return [codec.pause_from_row(r) for r in await self._read(body)]

    async def limits_state(self) -> LimitState:
        q, patterns = self._sql, json_encoder.encode(self.limits.patterns).decode()

        def body(conn: sqlite3.Connection, now: float) -> LimitState:
            found = conn.execute(q.running_by_component)
            running, keys = split_running((r[0], r[1], r[2]) for r in found)
            stored = conn.execute(q.rate_windows_get, (patterns,))
            windows = {r["pattern"]: (r["window_start"], r["used"]) for r in stored}
            return LimitState(now=now, running=running, windows=windows, keys=keys)

        return await self._read(body)

    async def session_ahead(self, run_id: str, session_id: str) -> bool:
        def body(conn: sqlite3.Connection, now: float) -> bool:
            found = conn.execute(self._sql.session_ahead, {"id": run_id, "session": session_id})
            return bool(found.fetchone()[0])

        return await self._read(body)

    async def queued_by_component(self, blocked: BudgetBlock | None = None) -> list[QueuedCount]:
        params = blocked_params(blocked)

        def body(conn: sqlite3.Connection, now: float) -> list[QueuedCount]:
            found = conn.execute(self._sql.queued_by_component, {**params, "now": now})
            return [QueuedCount(r[0], r[1], r[2], r[3], r[4]) for r in found]

        return await self._read(body)

    async def record_usage(
        self, worker_id: str, lease: Lease, *, tokens: int, cost: float, keys: Sequence[UsageKey]
    ) -> None:
        counters = [(k.scope, k.subject, k.period_start, cost, tokens, 0) for k in keys]
        usage = {"id": lease.run_id, "tokens": tokens, "cost": cost}

        def body(conn: sqlite3.Connection, now: float) -> None:
            # Unfenced on purpose: the tokens were spent whether or not the lease survived.
            conn.execute(self._sql.add_run_usage, usage)
            if counters:
                conn.executemany(self._sql.usage_upsert, counters)

        await self._write(body)

    async def count_claimed_run(self, keys: Sequence[UsageKey]) -> None:
        if not keys:
            return
        counters = [(k.scope, k.subject, k.period_start, 0.0, 0, 1) for k in keys]
        await self._write(lambda conn, now: conn.executemany(self._sql.usage_upsert, counters))

    async def usage_totals(self, keys: Sequence[UsageKey]) -> dict[UsageKey, UsageTotals]:
        def body(conn: sqlite3.Connection, now: float) -> dict[UsageKey, UsageTotals]:
            totals: dict[UsageKey, UsageTotals] = {}
            for key in keys:
                row = conn.execute(
                    self._sql.usage_get, (key.scope, key.subject, key.period_start)
                ).fetchone()
                totals[key] = (
                    UsageTotals(cost=row[0], tokens=row[1], runs=row[2])
                    if row is not None
                    else UsageTotals()
                )
            return totals

        return await self._read(body) if keys else {}

    async def usage_in_periods(
        self, periods: Sequence[tuple[str, float]]
    ) -> dict[UsageKey, UsageTotals]:
        def body(conn: sqlite3.Connection, now: float) -> dict[UsageKey, UsageTotals]:
            # One primary-key range probe per period; a gate asks for a handful of periods.
            found: dict[UsageKey, UsageTotals] = {}
            for scope, period_start in dict.fromkeys(periods):
                for row in conn.execute(self._sql.usage_in_period, (scope, period_start)):
                    key = UsageKey(row[0], row[1], row[2])
                    found[key] = UsageTotals(cost=row[3], tokens=row[4], runs=row[5])
            return found

        return await self._read(body) if periods else {}
