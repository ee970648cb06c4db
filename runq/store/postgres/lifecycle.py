"""A run's life under a lease on PostgreSQL: claim, heartbeat, complete, fail, pause."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

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
from runq.store.postgres.base import (
    PostgresBase,
    blocked_params,
    clocks_and_running,
)
from runq.store.postgres.connection import Pool
from runq.store.postgres.events import complete_carrying

#: One-statement limited claims tried before the locked transaction: each retry follows
#: another claimer's commit, so under heavy contention the lock is the cheaper queue.
ADMIT_ATTEMPTS = 3


class PostgresLifecycle(PostgresBase):
    """A group of ``Store`` verbs; ``PostgresStore`` composes the groups."""

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
        sql = self._sql
        claims = await self._claim_pool()
        rules = [serialize_sessions, *blocked_params(blocked)]
        if self.limits.enabled:
            found = await self._claim_limited(worker_id, slots, rules, deployment_id, run_id)
        elif run_id is not None:
            found = await claims.fetch(
                sql.claim_one, worker_id, run_id, *rules, deployment_id or ""
            )
        elif deployment_id:
            found = await claims.fetch(sql.claim_affinity, worker_id, slots, *rules, deployment_id)
        else:
            found = await self._claim_plain(claims, worker_id, slots, rules)
        for row in found:
            self._event_seqs.note(row["id"], row["event_seq"])
        runs, broken = verb_results.open_claimed(verb_results.in_claim_order(found), self._sealer)
        if broken:
            # Given back, not left running: a replica holding the wrong keys must neither
            # strand the batch nor spend attempts until the reaper dead-letters the runs.
            await self._db.fetch(
                sql.release,
                worker_id,
                [row["id"] for row, _ in broken],
                [row["attempt"] for row, _ in broken],
                [messages.not_executed(error) for _, error in broken],
            )
        return ClaimedRuns(runs, unopenable=(row["id"] for row, _ in broken))

    async def _claim_plain(
        self, claims: Pool, worker_id: str, slots: int, rules: list[Any]
    ) -> list[asyncpg.Record]:
        """The claim of a worker without a deployment: from the queue's head while there
        is a backlog (``claim_head.py``), else from the start of the claim index."""
        sql, head = self._sql, self._claim_head
        if not head.backlog:
            found: list[asyncpg.Record] = await claims.fetch(sql.claim, worker_id, slots, *rules)
            head.backlog = len(found) == slots
            return found
        if head.stale():
            head.read(await claims.fetchrow(sql.claim_head))
        found = []
        if head.key is not None:
            found = await claims.fetch(sql.claim_from_head, worker_id, slots, *rules, *head.key)
        if len(found) < slots:
            # Short: the backlog ends, or rows wait before the head (given back since it
            # was read). The rest comes from the start, and the head waits for a full claim.
            head.forget()
            found = [*found, *await claims.fetch(sql.claim, worker_id, slots - len(found), *rules)]
        return found

    async def give_back(self, worker_id: str, leases: Sequence[Lease]) -> None:
        if not leases:
            return
        await self._db.fetch(
            self._sql.release,
            worker_id,
            [lease.run_id for lease in leases],
            [lease.attempt for lease in leases],
            [None] * len(leases),
        )

    async def _claim_limited(
        self,
        worker_id: str,
        slots: int,
        rules: list[Any],
        deployment_id: str | None,
        run_id: str | None,
    ) -> list[asyncpg.Record]:
        """The claim under ``[limits]``: one statement (``admit``) while its snapshot is
        fresh; a claimer that keeps losing the race to others falls back to the locked
        transaction, which always makes progress."""
        sql, limits = self._sql, self.limits
        claims = await self._claim_pool()
        dep = deployment_id or ""
        gate = [
            limits.like_patterns,
            limits.max_running_caps(),
            limits.per_key_max(),
            limits.rate_caps(),
            limits.rate_periods(),
            limits.patterns,
        ]
        second: str | int = slots
        if run_id is not None:
            statement, second = sql.admit_one, run_id
        else:
            statement = sql.admit_affinity if deployment_id else sql.admit
        for _ in range(ADMIT_ATTEMPTS):
            found = await claims.fetch(statement, worker_id, second, *rules, dep, *gate)
            if found[0]["fresh"]:
                return [r for r in found if r["id"] is not None]
        for _ in range(ADMIT_ATTEMPTS):
            locked = await self._db.contended(
                lambda: self._claim_locked(worker_id, slots, rules, deployment_id, run_id),
                verb="claim_locked",
            )
            if locked is not None:
                return locked
        return []

    async def _claim_locked(
        self,
        worker_id: str,
        slots: int,
        rules: list[Any],
        deployment_id: str | None,
        run_id: str | None,
    ) -> list[asyncpg.Record] | None:
        """The claim under ``[limits]`` as a transaction: take the limits lock, count what
        runs and what each rate window has spent, claim within the room left, and count the
        starts into the rate windows. The lock makes the count and the claim one step for
        the fleet: a second claimer counts after this one commits. None (nothing claimed;
        try again) when the wait for the lock outlasted a rate window: the claim would
        stamp its runs with the transaction's start, in a window already gone."""
        sql, limits = self._sql, self.limits
        async with self._db.transaction() as con:
            await con.execute(sql.limits_lock)
            now, clock, rows_running = clocks_and_running(await con.fetch(sql.running_by_component))
            if limits.has_rates and limits.crosses_window(now, clock):
                return None
            running = limits.running_by_group((c, n) for c, _, n in rows_running)
            keyed = limits.key_running(rows_running)
            used = [0] * len(limits.groups)
            if limits.has_rates:
                stored = await con.fetch(sql.rate_windows_get, limits.patterns)
                used = limits.rate_used(
                    now, {r["pattern"]: (r["window_start"], r["used"]) for r in stored}
                )
            gate = [
                limits.like_patterns,
                limits.room(running, used),
                limits.per_key_max(),
                [i + 1 for i, _, _ in keyed],  # SQL arrays count from 1
                [key for _, key, _ in keyed],
                [n for _, _, n in keyed],
            ]
            dep = deployment_id or ""
            if run_id is not None:
                found = await con.fetch(
                    sql.claim_limited_one, worker_id, run_id, *rules, dep, *gate
                )
            elif deployment_id:
                found = await con.fetch(
                    sql.claim_limited_affinity, worker_id, slots, *rules, dep, *gate
                )
            else:
                found = await con.fetch(sql.claim_limited, worker_id, slots, *rules, dep, *gate)
            if limits.has_rates and found:
                bumps = limits.started(
                    now, (f"{r['component_type']}/{r['component_id']}" for r in found)
                )
                if bumps:
                    await con.execute(
                        sql.rate_windows_bump,
                        list(bumps),
                        [start for start, _ in bumps.values()],
                        [n for _, n in bumps.values()],
                    )
        return list(found)

    async def heartbeat_many(self, worker_id: str, leases: Sequence[Lease]) -> HeartbeatResult:
        found = await self._db.fetch(
            self._sql.heartbeat,
            worker_id,
            [le.run_id for le in leases],
            [le.attempt for le in leases],
        )
        renewed = [r for r in found if r["attempt"] is not None]
        return verb_results.heartbeat_result(
            leases,
            {(r["id"], r["attempt"]) for r in renewed},
            (r["id"] for r in renewed if r["cancel_requested"]),
            busy=(r["id"] for r in found if r["attempt"] is None),
        )

    async def complete_many(self, worker_id: str, completions: Sequence[Completion]) -> FenceResult:
        if not completions:
            return FenceResult()
        ordered = sorted(completions, key=lambda c: c.run_id)
        if any(c.events or c.trim_level is not None for c in ordered):
            applied = await complete_carrying(
                self._db, self._sql, self._sealer, worker_id, ordered, self._event_seqs
            )
            return verb_results.fence_result(completions, applied)
        done = await self._db.fetch(
            self._sql.complete,
            worker_id,
            [c.run_id for c in ordered],
            [c.attempt for c in ordered],
            [codec.seal_answer(self._sealer, c) for c in ordered],
            [c.termination_reason.value for c in ordered],
        )
        return verb_results.fence_result(completions, {r["id"] for r in done})

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
        status = await self._db.fetchval(
            self._sql.fail,
            lease.run_id,
            lease.attempt,
            worker_id,
            retryable,
            max(float(retry_in_seconds), 0.0),
            error,
            codec.seal_error_detail(self._sealer, lease.run_id, error_detail),
        )
        return verb_results.fail_outcome(status)

    async def pause(
        self, worker_id: str, lease: Lease, *, reason: str, state: Any, summary: str | None = None
    ) -> bool:
        sealed = codec.seal_json(self._sealer, "resume_state", lease.run_id, state)
        found = await self._db.fetchval(
            self._sql.pause, lease.run_id, lease.attempt, worker_id, reason, sealed, summary
        )
        return found is not None

    async def settle_cancelled(self, worker_id: str, lease: Lease) -> bool:
        found = await self._db.fetchval(
            self._sql.settle_cancelled, lease.run_id, lease.attempt, worker_id
        )
        return found is not None

    async def set_non_idempotent(self, worker_id: str, lease: Lease, inside: bool) -> bool:
        found = await self._db.fetchval(
            self._sql.set_non_idempotent, lease.run_id, lease.attempt, worker_id, inside
        )
        return found is not None
