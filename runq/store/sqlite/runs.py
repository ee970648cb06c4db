"""Producer verbs on SQLite: submit, get, cancel, continue and requeue."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from runq.errors import (
    Conflict,
    IdempotencyConflict,
    InvalidTransition,
    NotFound,
    QueueFull,
)
from runq.ids import new_run_id
from runq.model import TRANSITIONS, NewRun, Run, Status, SubmitResult
from runq.store import batch, codec, messages, verb_results
from runq.store.sqlite.base import SqliteBase
from runq.store.sqlite.connection import Row

#: What a batch's write transaction decided: the plan, the stored runs it answers with
#: (by id) and the transaction's clock.
_Planned = tuple[batch.BatchPlan, dict[str, Row], float]


class SqliteRuns(SqliteBase):
    """A group of ``Store`` verbs; ``SqliteStore`` composes the groups."""

    async def submit(
        self,
        new: NewRun,
        *,
        max_queue_depth: int,
        wake: bool = False,
        max_delayed: int = 0,
        max_queued_per_user: int = 0,
    ) -> SubmitResult:
        # ``wake`` asks for an in-statement NOTIFY; SQLite has none (claimers poll or are
        # woken in process), so it is ignored.
        run_id = new.id or new_run_id()
        # Encode (and seal) before the transaction: a bad payload never takes the write lock.
        encoded = codec.encoded_payload(new)
        values = codec.insert_values(new, run_id, self._sealer, encoded)
        params: dict[str, Any] = {
            **values._asdict(),
            "concurrency_key": new.concurrency_key,
            "timeout_seconds": new.timeout_seconds,
        }
        key, user = new.idempotency_key, new.actor.user_id or ""
        delayed, limits = values.delay > 0, (max_delayed, max_queued_per_user)

        unique, unique_component = new.unique, f"{new.component_type}/{new.component_id}"

        def body(conn: sqlite3.Connection, now: float) -> tuple[Row | None, float]:
            # The writer's IMMEDIATE transaction serializes submitters of one unique key.
            if unique is not None:
                held: Row | None = conn.execute(
                    self._schedule_sql.unique_get,
                    {"component": unique_component, "key": unique.key},
                ).fetchone()
                if held is not None and unique.holds(
                    Status(held["status"]), held["created_at"], now
                ):
                    return held, now
            if key is not None:
                existing: Row | None = conn.execute(self._sql.by_key, (key, user)).fetchone()
                if existing is not None:
                    component = f"{existing['component_type']}/{existing['component_id']}"
                    if component != f"{new.component_type}/{new.component_id}":
                        raise IdempotencyConflict(messages.idempotency_conflict(key, component))
                    return existing, now
            self._check_depth(conn, now, delayed, user, max_queue_depth, limits)
            try:
                conn.execute(self._sql.insert, {**params, "now": now})
            except sqlite3.IntegrityError as e:
                raise Conflict(messages.run_exists(run_id)) from e
            if unique is not None:
                conn.execute(
                    self._schedule_sql.unique_set,
                    {"component": unique_component, "key": unique.key, "run_id": run_id},
                )
            return None, now

        existing, now = await self._write(body)
        if existing is not None:
            return SubmitResult(self._run(existing), created=False)
        return SubmitResult(codec.fresh_run(new, values, encoded, now), created=True)

    def _check_depth(
        self,
        conn: sqlite3.Connection,
        now: float,
        delayed: bool,
        user: str,
        max_queue_depth: int,
        limits: tuple[int, int],
    ) -> None:
        """Submit's depth gates (see ``Store.submit``), inside its write transaction."""
        max_delayed, max_per_user = limits
        if delayed and max_delayed > 0:
            count = conn.execute(self._sql.count_delayed, (now, max_delayed)).fetchone()[0]
            if count >= max_delayed:
                raise QueueFull(messages.delayed_full(max_delayed))
        if not delayed and max_queue_depth > 0:
            count = conn.execute(self._sql.count_due, (now, max_queue_depth)).fetchone()[0]
            if count >= max_queue_depth:
                raise QueueFull(messages.queue_full(max_queue_depth))
        if user and max_per_user > 0:
            count = conn.execute(self._sql.count_user_queued, (user, max_per_user)).fetchone()[0]
            if count >= max_per_user:
                raise QueueFull(messages.user_queue_full(max_per_user))

    async def submit_many(self, news: Sequence[NewRun]) -> list[str]:
        ids = batch.run_ids(news)
        encoded = [codec.encoded_payload(new) for new in news]
        records = [
            {
                **values._asdict(),
                "concurrency_key": new.concurrency_key,
                "timeout_seconds": new.timeout_seconds,
            }
            for new, values in zip(
                news, codec.insert_values_many(news, ids, self._sealer, encoded), strict=True
            )
        ]

        def body(conn: sqlite3.Connection, now: float) -> None:
            try:
                conn.executemany(self._sql.insert, [{**row, "now": now} for row in records])
            except sqlite3.IntegrityError as e:
                raise Conflict(messages.bulk_refused(e)) from e

        if records:
            await self._write(body)
        return ids

    async def submit_batch(
        self,
        news: Sequence[NewRun],
        *,
        max_queue_depth: int,
        max_delayed: int = 0,
        max_queued_per_user: int = 0,
    ) -> list[SubmitResult]:
        ids = batch.run_ids(news)
        # Every payload encoded and sealed before the write lock: a bad one stores nothing.
        encoded = [codec.encoded_payload(new) for new in news]
        values = codec.insert_values_many(news, ids, self._sealer, encoded)
        limits = batch.DepthLimits(max_queue_depth, max_delayed, max_queued_per_user)

        def body(conn: sqlite3.Connection, now: float) -> _Planned:
            plan = batch.plan_batch(
                news, self._stored_keys(conn, news), self._held(conn, news, now)
            )
            for gate in batch.gates(news, plan, limits):
                gate.check(self._count(conn, gate, now))
            fresh = plan.fresh
            params = [
                {
                    **values[i]._asdict(),
                    "concurrency_key": news[i].concurrency_key,
                    "timeout_seconds": news[i].timeout_seconds,
                    "now": now,
                }
                for i in fresh
            ]
            try:
                conn.executemany(self._sql.insert, params)
            except sqlite3.IntegrityError as e:
                raise Conflict(messages.bulk_refused(e)) from e
            for i in fresh:
                slot = batch.unique_slot(news[i])
                if slot is not None:
                    key = {"component": slot[0], "key": slot[1], "run_id": ids[i]}
                    conn.execute(self._schedule_sql.unique_set, key)
            found = {
                run_id: conn.execute(self._sql.get, (run_id,)).fetchone()
                for run_id in plan.stored_ids
            }
            return plan, found, now

        if not news:
            return []
        plan, found, now = await self._write(body)
        fresh_runs = {i: codec.fresh_run(news[i], values[i], encoded[i], now) for i in plan.fresh}
        results: list[SubmitResult] = []
        for i, answer in enumerate(plan.answer):
            run = self._run(found[answer]) if isinstance(answer, str) else fresh_runs[answer]
            results.append(SubmitResult(run, created=plan.created(i)))
        return results

    def _stored_keys(self, conn: sqlite3.Connection, news: Sequence[NewRun]) -> batch.StoredKeys:
        stored: dict[tuple[str, str], tuple[str, str]] = {}
        for new in news:
            slot = batch.idempotency_slot(new)
            if slot is None or slot in stored:
                continue
            row: Row | None = conn.execute(self._sql.by_key, slot).fetchone()
            if row is not None:
                stored[slot] = (row["id"], f"{row['component_type']}/{row['component_id']}")
        return stored

    def _held(
        self, conn: sqlite3.Connection, news: Sequence[NewRun], now: float
    ) -> batch.HeldUnique:
        held: dict[tuple[str, str], str] = {}
        for new in news:
            slot = batch.unique_slot(new)
            if slot is None or new.unique is None or slot in held:
                continue
            query = {"component": slot[0], "key": slot[1]}
            row: Row | None = conn.execute(self._schedule_sql.unique_get, query).fetchone()
            if row is not None and new.unique.holds(Status(row["status"]), row["created_at"], now):
                held[slot] = row["id"]
        return held

    def _count(self, conn: sqlite3.Connection, gate: batch.Gate, now: float) -> int:
        if gate.kind == "user":
            params: tuple[Any, ...] = (gate.user, gate.limit)
            sql = self._sql.count_user_queued
        else:
            params = (now, gate.limit)
            sql = self._sql.count_due if gate.kind == "due" else self._sql.count_delayed
        counted: int = conn.execute(sql, params).fetchone()[0]
        return counted

    async def get(self, run_id: str) -> Run | None:
        row = await self._db.read_one(self._sql.get, (run_id,))
        return self._run(row) if row is not None else None

    async def error_detail(self, run_id: str) -> str | None:
        row = await self._db.read_one(self._sql.error_detail, (run_id,))
        sealed = None if row is None else row["error_detail"]
        return codec.open_error_detail(self._sealer, run_id, sealed)

    async def cancel(self, run_id: str) -> Run:
        def body(conn: sqlite3.Connection, now: float) -> Row:
            params = {"id": run_id, "now": now}
            row: Row | None = conn.execute(self._sql.cancel_now, params).fetchone()
            if row is None:
                row = conn.execute(self._sql.cancel_request, params).fetchone()
            if row is None:
                row = conn.execute(self._sql.get, (run_id,)).fetchone()
                if row is None:
                    raise NotFound(messages.not_found(run_id))
                if row["status"] != Status.CANCELLED:
                    raise Conflict(messages.cancel_refused(run_id, row["status"]))
            return row

        return self._run(await self._write(body))

    async def continue_(self, run_id: str, decision: Any) -> Run:
        sealed = codec.seal_json(self._sealer, "decision", run_id, decision)

        def body(conn: sqlite3.Connection, now: float) -> Row:
            params = {"id": run_id, "now": now, "decision": sealed}
            row: Row | None = conn.execute(self._sql.continue_, params).fetchone()
            if row is not None:
                return row
            row = conn.execute(self._sql.get, (run_id,)).fetchone()
            if row is None:
                raise NotFound(messages.not_found(run_id))
            if verb_results.is_repeat_continue(row):
                return row
            raise Conflict(messages.continue_refused(run_id, row["status"]))

        return self._run(await self._write(body))

    async def requeue(
        self, run_id: str, *, clear_cancellation: bool, force: bool, lock_grace_seconds: float
    ) -> Run:
        def body(conn: sqlite3.Connection, now: float) -> Row:
            row: Row | None = conn.execute(self._sql.get, (run_id,)).fetchone()
            if row is None:
                raise NotFound(messages.not_found(run_id))
            if row["status"] not in TRANSITIONS["requeue"].sources:
                raise InvalidTransition(messages.requeue_refused(run_id, row["status"]))
            if verb_results.requeue_is_too_soon(
                row, now=now, force=force, grace=lock_grace_seconds
            ):
                raise Conflict(messages.requeue_too_soon(run_id, lock_grace_seconds))
            params = {"id": run_id, "now": now, "clear": 1 if clear_cancellation else 0}
            updated: Row = conn.execute(self._sql.requeue, params).fetchone()
            return updated

        return self._run(await self._write(body))
