"""Producer verbs on PostgreSQL: submit (unique runs too), get, cancel, continue and requeue."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from runq.errors import (
    Conflict,
    IdempotencyConflict,
    InvalidTransition,
    NotFound,
    QueueFull,
    StoreUnavailable,
)
from runq.ids import new_run_id
from runq.model import TRANSITIONS, NewRun, Run, Status, SubmitResult
from runq.store import batch, codec, messages, verb_results
from runq.store.postgres.base import PostgresBase
from runq.store.postgres.bulk import RunCopy
from runq.store.postgres.connection import Pool

#: How often submit re-runs after losing an idempotency race (the winner is then visible).
_SUBMIT_ATTEMPTS = 3


class PostgresRuns(PostgresBase):
    """A group of ``Store`` verbs; ``PostgresStore`` composes the groups."""

    async def submit(
        self,
        new: NewRun,
        *,
        max_queue_depth: int,
        wake: bool = False,
        max_delayed: int = 0,
        max_queued_per_user: int = 0,
    ) -> SubmitResult:
        run_id = new.id or new_run_id()
        # Encode before any SQL: a value that is not JSON raises InvalidPayload, nothing written.
        values = codec.insert_values(new, run_id, self._sealer, codec.encoded_payload(new))
        args = (
            *values,
            max(max_queue_depth, 0),
            self.channel if wake else None,
            new.concurrency_key,
            max(max_delayed, 0),
            max(max_queued_per_user, 0),
            new.timeout_seconds,
        )
        if new.unique is not None:
            return await self._db.contended(
                lambda: self._submit_unique(new, args, max_queue_depth), verb="submit_unique"
            )
        return await self._submit_row(new, args, max_queue_depth, self._db)

    async def _submit_row(
        self,
        new: NewRun,
        args: Sequence[Any],
        max_queue_depth: int,
        db: Pool | asyncpg.Connection,
    ) -> SubmitResult:
        """The submit statement on ``db`` (the pool, or a connection inside a transaction);
        ``args`` as ``_submit_sql`` numbers them."""
        run_id = args[0]
        delay, max_delayed, max_queued_per_user = args[12], args[18], args[19]
        for _ in range(_SUBMIT_ATTEMPTS):
            try:
                row = await db.fetchrow(self._sql.submit, *args)
            except asyncpg.UniqueViolationError as e:  # the primary key: an explicit id reused
                raise Conflict(messages.run_exists(run_id)) from e
            assert row is not None  # the submit statement always answers with one row
            if row["id"] is not None:
                return SubmitResult(self._run(row), True)
            if row["existing_id"] is not None:
                return await self._existing(new, row["existing_id"], row["existing_component"])
            if row["user_full"]:
                raise QueueFull(messages.user_queue_full(max_queued_per_user))
            if row["queue_full"] and delay > 0:
                raise QueueFull(messages.delayed_full(max_delayed))
            if row["queue_full"]:
                raise QueueFull(messages.queue_full(max_queue_depth))
            # Lost an idempotency race to a transaction that committed meanwhile: go again.
        raise StoreUnavailable(
            f"submit of idempotency key {new.idempotency_key!r} kept racing; try again"
        )

    async def _existing(self, new: NewRun, run_id: str, component: str) -> SubmitResult:
        if component != f"{new.component_type}/{new.component_id}":
            raise IdempotencyConflict(
                messages.idempotency_conflict(new.idempotency_key or "", component)
            )
        run = await self.get(run_id)
        if run is None:  # purged between the two statements; extremely unlikely
            raise StoreUnavailable(f"run {run_id} vanished while answering its idempotency key")
        return SubmitResult(run, False)

    async def submit_many(self, news: Sequence[NewRun]) -> list[str]:
        ids = batch.run_ids(news)
        if not ids:
            return ids
        # Every payload encoded before any SQL, so a bad value writes nothing.
        encoded = list(map(codec.encoded_payload, news))
        order = batch.insert_order(news, range(len(news)))

        async def copy(con: asyncpg.Connection) -> None:
            # One clock for the batch, the transaction's (what the INSERT would use); then
            # binary COPY straight into the run table: the unique index still refuses a
            # taken idempotency key for the whole batch.
            now: float = await con.fetchval(self._sql.now)
            await RunCopy(con, self.schema, self._sealer, now).write(news, ids, encoded, order)

        try:
            await self._db.in_transaction(copy, verb="submit_many")
        except asyncpg.UniqueViolationError as e:
            raise Conflict(messages.bulk_refused(e)) from e
        return ids

    async def submit_batch(
        self,
        news: Sequence[NewRun],
        *,
        max_queue_depth: int,
        max_delayed: int = 0,
        max_queued_per_user: int = 0,
    ) -> list[SubmitResult]:
        if not news:
            return []
        ids = batch.run_ids(news)
        # Every payload encoded before any SQL, so a bad value writes nothing.
        encoded = [codec.encoded_payload(n) for n in news]
        limits = batch.DepthLimits(max_queue_depth, max_delayed, max_queued_per_user)
        for _ in range(_SUBMIT_ATTEMPTS):
            try:
                return await self._db.contended(
                    lambda: self._submit_batch_once(news, ids, encoded, limits),
                    verb="submit_batch",
                )
            except asyncpg.UniqueViolationError as e:
                if (e.constraint_name or "").endswith("_pkey"):
                    raise Conflict(messages.bulk_refused(e)) from e
                # An idempotency key of the batch was taken by a submit that committed
                # meanwhile: plan again, which now finds it.
        raise StoreUnavailable("a batch submit kept racing other submits of its keys; try again")

    async def _submit_batch_once(
        self,
        news: Sequence[NewRun],
        ids: Sequence[str],
        encoded: Sequence[bytes | None],
        limits: batch.DepthLimits,
    ) -> list[SubmitResult]:
        async with self._db.transaction() as con:
            now: float = await con.fetchval(self._sql.now)
            held = await self._lock_unique(con, news)
            plan = batch.plan_batch(news, await self._stored_keys(con, news), held)
            for gate in batch.gates(news, plan, limits):
                gate.check(await self._count(con, gate))
            fresh = plan.fresh
            # Binary COPY, as submit_many: the unique index still refuses a key taken
            # meanwhile (the caller plans again).
            fresh_runs: dict[int, Run] = {}
            values = await RunCopy(con, self.schema, self._sealer, now).write(
                news, ids, encoded, batch.insert_order(news, fresh), runs=fresh_runs
            )
            for i in fresh:
                slot = batch.unique_slot(news[i])
                if slot is not None:
                    await con.execute(self._schedule_sql.unique_set, *slot, values[i].id)
            stored = list(plan.stored_ids)
            found = await con.fetch(self._sql.get_many, stored) if stored else []
        by_id = {row["id"]: self._run(row) for row in found}
        # Positional: SubmitResult(run, created) per item of a batch of thousands.
        return [
            SubmitResult(by_id[answer], False)
            if isinstance(answer, str)
            else SubmitResult(fresh_runs[answer], answer == i)
            for i, answer in enumerate(plan.answer)
        ]

    async def _lock_unique(
        self, con: asyncpg.Connection, news: Sequence[NewRun]
    ) -> batch.HeldUnique:
        """Lock the batch's unique keys (sorted, so two batches never deadlock) and return
        the ones whose run still holds them."""
        specs = {batch.unique_slot(n): n.unique for n in news if n.unique is not None}
        held: dict[tuple[str, str], str] = {}
        for slot in sorted(s for s in specs if s is not None):
            spec = specs[slot]
            assert spec is not None
            lock = await con.fetchrow(self._schedule_sql.unique_lock, *slot)
            if lock["run_id"] is None:
                continue
            row = await con.fetchrow(self._sql.get, lock["run_id"])
            if row is not None and spec.holds(
                Status(row["status"]), row["created_at"], lock["db_now"]
            ):
                held[slot] = row["id"]
        return held

    async def _stored_keys(
        self, con: asyncpg.Connection, news: Sequence[NewRun]
    ) -> batch.StoredKeys:
        slots = {s for s in map(batch.idempotency_slot, news) if s is not None}
        if not slots:
            return {}
        keys, users = zip(*slots, strict=True)
        found = await con.fetch(self._sql.batch_keys, list(keys), list(users))
        return {
            (row["idempotency_key"], row["user_key"]): (row["id"], row["component"])
            for row in found
        }

    async def _count(self, con: asyncpg.Connection, gate: batch.Gate) -> int:
        if gate.kind == "user":
            counted: int = await con.fetchval(self._sql.batch_count_user, gate.user, gate.limit)
        elif gate.kind == "due":
            counted = await con.fetchval(self._sql.batch_count_due, gate.limit)
        else:
            counted = await con.fetchval(self._sql.batch_count_delayed, gate.limit)
        return counted

    async def get(self, run_id: str) -> Run | None:
        row = await self._db.fetchrow(self._sql.get, run_id, retry=True)
        return None if row is None else self._run(row)

    async def error_detail(self, run_id: str) -> str | None:
        sealed = await self._db.fetchval(self._sql.error_detail, run_id, retry=True)
        return codec.open_error_detail(self._sealer, run_id, sealed)

    async def _refusal(self, run_id: str) -> Run:
        """The run as it is now, for deciding why a conditional UPDATE matched nothing."""
        run = await self.get(run_id)
        if run is None:
            raise NotFound(messages.not_found(run_id))
        return run

    async def cancel(self, run_id: str) -> Run:
        row = await self._db.fetchrow(self._sql.cancel, run_id)
        if row is not None:
            return self._run(row)
        run = await self._refusal(run_id)
        if run.status == Status.CANCELLED:
            return run
        raise Conflict(messages.cancel_refused(run_id, run.status.value))

    async def continue_(self, run_id: str, decision: Any) -> Run:
        sealed = codec.seal_json(self._sealer, "decision", run_id, decision)
        row = await self._db.fetchrow(self._sql.continue_, run_id, sealed)
        if row is not None:
            return self._run(row)
        row = await self._db.fetchrow(self._sql.get, run_id, retry=True)
        if row is None:
            raise NotFound(messages.not_found(run_id))
        if verb_results.is_repeat_continue(row):
            return self._run(row)
        raise Conflict(messages.continue_refused(run_id, row["status"]))

    async def requeue(
        self, run_id: str, *, clear_cancellation: bool, force: bool, lock_grace_seconds: float
    ) -> Run:
        row = await self._db.fetchrow(
            self._sql.requeue, run_id, clear_cancellation, force, float(lock_grace_seconds)
        )
        if row is not None:
            return self._run(row)
        run = await self._refusal(run_id)
        if run.status not in TRANSITIONS["requeue"].sources:
            raise InvalidTransition(messages.requeue_refused(run_id, run.status.value))
        raise Conflict(messages.requeue_too_soon(run_id, lock_grace_seconds))

    async def _submit_unique(
        self, new: NewRun, args: Sequence[Any], max_queue_depth: int
    ) -> SubmitResult:
        """Submit under the unique key's lock row: the first of concurrent submitters of a
        key inserts, the others wait for its commit and then find its run."""
        assert new.unique is not None
        component = f"{new.component_type}/{new.component_id}"
        sql = self._schedule_sql
        async with self._db.transaction() as con:
            lock = await con.fetchrow(sql.unique_lock, component, new.unique.key)
            if lock["run_id"] is not None:
                row = await con.fetchrow(self._sql.get, lock["run_id"])
                if row is not None and new.unique.holds(
                    Status(row["status"]), row["created_at"], lock["db_now"]
                ):
                    return SubmitResult(self._run(row), False)
            result = await self._submit_row(new, args, max_queue_depth, con)
            if result.created:
                await con.execute(sql.unique_set, component, new.unique.key, result.run.id)
            return result
