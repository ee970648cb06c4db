"""A run's life under a lease on SQLite: claim, heartbeat, complete, fail, pause."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Sequence
from typing import Any

import anyio

from runq.model import (
    BudgetBlock,
    ClaimedRuns,
    Completion,
    FailOutcome,
    FenceResult,
    HeartbeatResult,
    Lease,
)
from runq.store import codec, messages, verb_results
from runq.store.sqlite import statements as sql
from runq.store.sqlite.base import SqliteBase, blocked_params, json_encoder
from runq.store.sqlite.connection import Row
from runq.store.sqlite.events import complete_with_events


class SqliteLifecycle(SqliteBase):
    """A group of ``Store`` verbs; ``SqliteStore`` composes the groups."""

    async def claim(
        self,
        worker_id: str,
        slots: int,
        *,
        deployment_id: str | None,
        serialize_sessions: bool = True,
        blocked: BudgetBlock | None = None,
        run_id: str | None = None,
    ) -> ClaimedRuns:
        if slots <= 0:
            return ClaimedRuns()
        block = blocked if blocked is not None and not blocked.empty else None
        shape = sql.ClaimShape(
            deployment=bool(deployment_id),
            sessions=serialize_sessions,
            block_users=block is not None and bool(block.users),
            block_configurations=block is not None and bool(block.configurations),
            block_pairs=block is not None and bool(block.pairs),
            by_id=run_id is not None,
            limited=self.limits.enabled,
        )
        statement = self._sql.claims[shape]
        params: dict[str, Any] = {
            "worker": worker_id,
            "slots": 1 if run_id is not None else slots,
            "dep": deployment_id or "",
            "run_id": run_id,
        }
        if block is not None:
            params.update(blocked_params(block))

        def body(conn: sqlite3.Connection, now: float) -> list[Row]:
            if self.limits.enabled:
                # Under BEGIN IMMEDIATE: no other claimer can start a run between this
                # count and the claim, so the room is exact.
                return self._claim_limited(conn, statement, {**params, "now": now}, now)
            return conn.execute(statement, {**params, "now": now}).fetchall()

        # The transaction runs on the connection thread and finishes even if this coroutine
        # is cancelled meanwhile (a shutdown). Its runs would then sit "running" under a
        # lease nobody holds until the reaper dead-letters them, so give them back instead.
        task = asyncio.ensure_future(self._write(body))
        try:
            claimed = await asyncio.shield(task)
        except asyncio.CancelledError:
            with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
                await self._release(worker_id, [(r, None) for r in await task])
            raise
        runs, broken = verb_results.open_claimed(verb_results.in_claim_order(claimed), self._sealer)
        # A run whose sealed values do not open is given back (queued, attempt restored)
        # with the reason in ``error``, so one bad row neither strands the batch nor gets
        # dead-lettered by a replica holding the wrong key.
        await self._release(worker_id, [(r, messages.not_executed(e)) for r, e in broken])
        return ClaimedRuns(runs, unopenable=(r["id"] for r, _ in broken))

    async def give_back(self, worker_id: str, leases: Sequence[Lease]) -> None:
        await self._give_back(worker_id, [(lease.run_id, lease.attempt, None) for lease in leases])

    async def _release(self, worker_id: str, given_back: Sequence[tuple[Row, str | None]]) -> None:
        """Undo a claim (fenced on the lease it took): queued again, attempt restored."""
        await self._give_back(worker_id, [(r["id"], r["attempt"], e) for r, e in given_back])

    async def _give_back(
        self, worker_id: str, given_back: Sequence[tuple[str, int, str | None]]
    ) -> None:
        if not given_back:
            return
        batch = [
            {"id": run_id, "attempt": attempt, "worker": worker_id, "error": error}
            for run_id, attempt, error in given_back
        ]

        def body(conn: sqlite3.Connection, now: float) -> None:
            for params in batch:
                conn.execute(self._sql.release, {**params, "now": now})

        await self._write(body)

    def _claim_limited(
        self, conn: sqlite3.Connection, statement: str, params: dict[str, Any], now: float
    ) -> list[Row]:
        """Count what runs and what each rate window has spent, claim within the room left,
        and count the starts into the rate windows, all in the claim's transaction."""
        limits, q = self.limits, self._sql
        rows_running = [
            (r["component"], r["concurrency_key"], r["n"])
            for r in conn.execute(q.running_by_component)
        ]
        running = limits.running_by_group((c, n) for c, _, n in rows_running)
        params["kmax"] = json_encoder.encode(limits.per_key_max()).decode()
        params["krun"] = json_encoder.encode(limits.key_running(rows_running)).decode()
        used = [0] * len(limits.groups)
        if limits.has_rates:
            stored = conn.execute(
                q.rate_windows_get, (json_encoder.encode(limits.patterns).decode(),)
            )
            used = limits.rate_used(
                now, {r["pattern"]: (r["window_start"], r["used"]) for r in stored}
            )
        params["pats"] = json_encoder.encode(limits.patterns).decode()
        params["rooms"] = json_encoder.encode(limits.room(running, used)).decode()
        found: list[Row] = conn.execute(statement, params).fetchall()
        if limits.has_rates and found:
            bumps = limits.started(
                now, (f"{r['component_type']}/{r['component_id']}" for r in found)
            )
            conn.executemany(
                q.rate_windows_bump, [(p, start, n) for p, (start, n) in bumps.items()]
            )
        return found

    async def heartbeat_many(self, worker_id: str, leases: Sequence[Lease]) -> HeartbeatResult:
        lease_json = json_encoder.encode(list(leases)).decode()

        def body(conn: sqlite3.Connection, now: float) -> list[Row]:
            conn.execute(self._sql.touch_worker, (now, worker_id))
            if not leases:
                return []
            params = {"now": now, "worker": worker_id, "leases": lease_json}
            return conn.execute(self._sql.heartbeat, params).fetchall()

        renewed = await self._write(body)
        return verb_results.heartbeat_result(
            leases, {(r[0], r[1]) for r in renewed}, (r[0] for r in renewed if r[2])
        )

    async def complete_many(self, worker_id: str, completions: Sequence[Completion]) -> FenceResult:
        if not completions:
            return FenceResult()
        batch: list[dict[str, Any]] = [
            {
                "id": c.run_id,
                "attempt": c.attempt,
                "worker": worker_id,
                "reason": str(c.termination_reason),
                "answer": codec.seal_answer(self._sealer, c),
            }
            for c in completions
        ]

        def body(conn: sqlite3.Connection, now: float) -> set[str]:
            # One transaction, one prepared statement executed per run (no round trips):
            # each write is fenced on its own row, so one lost lease fences only itself.
            applied: set[str] = set()
            for params, c in zip(batch, completions, strict=True):
                params = {**params, "now": now}
                if c.events or c.trim_level is not None:
                    if complete_with_events(conn, self._sql, self._sealer, params, c):
                        applied.add(c.run_id)
                elif conn.execute(self._sql.complete, params).fetchone():
                    applied.add(params["id"])
            return applied

        return verb_results.fence_result(completions, await self._write(body))

    async def _fenced(self, statement: str, worker_id: str, lease: Lease, **extra: Any) -> bool:
        """Run one fenced write; True when it applied."""
        params = {"id": lease.run_id, "attempt": lease.attempt, "worker": worker_id, **extra}

        def body(conn: sqlite3.Connection, now: float) -> bool:
            return conn.execute(statement, {**params, "now": now}).fetchone() is not None

        return await self._write(body)

    async def fail(
        self,
        worker_id: str,
        lease: Lease,
        *,
        error: str,
        retryable: bool,
        retry_in_seconds: float,
        error_detail: str | None = None,
    ) -> FailOutcome:
        params = {
            "id": lease.run_id,
            "attempt": lease.attempt,
            "worker": worker_id,
            "error": error,
            "error_detail": codec.seal_error_detail(self._sealer, lease.run_id, error_detail),
            "retryable": 1 if retryable else 0,
            "delay": max(float(retry_in_seconds), 0.0),
        }

        def body(conn: sqlite3.Connection, now: float) -> str | None:
            row = conn.execute(self._sql.fail, {**params, "now": now}).fetchone()
            return None if row is None else str(row[0])

        return verb_results.fail_outcome(await self._write(body))

    async def pause(
        self, worker_id: str, lease: Lease, *, reason: str, state: Any, summary: str | None = None
    ) -> bool:
        sealed = codec.seal_json(self._sealer, "resume_state", lease.run_id, state)
        return await self._fenced(
            self._sql.pause, worker_id, lease, reason=reason, state=sealed, summary=summary
        )

    async def settle_cancelled(self, worker_id: str, lease: Lease) -> bool:
        return await self._fenced(self._sql.settle_cancelled, worker_id, lease)

    async def set_non_idempotent(self, worker_id: str, lease: Lease, inside: bool) -> bool:
        return await self._fenced(
            self._sql.non_idempotent, worker_id, lease, inside=1 if inside else 0
        )
