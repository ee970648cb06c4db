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
from runq.model import (
    TRANSITIONS,
    NewRun,
    Run,
    Status,
    SubmitResult,
    new_run_id,
)
from runq.store import messages, rows
from runq.store.sqlite.base import SqliteBase
from runq.store.sqlite.connection import Row


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
        encoded = rows.encoded_payload(new)
        values = rows.insert_values(new, run_id, self._sealer, encoded)
        params: dict[str, Any] = {**values._asdict(), "concurrency_key": new.concurrency_key}
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
        return SubmitResult(rows.fresh_run(new, values, encoded, now), created=True)

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
        ids = [new.id or new_run_id() for new in news]
        batch = [
            {
                **rows.insert_values(
                    new, run_id, self._sealer, rows.encoded_payload(new)
                )._asdict(),
                "concurrency_key": new.concurrency_key,
            }
            for new, run_id in zip(news, ids, strict=True)
        ]

        def body(conn: sqlite3.Connection, now: float) -> None:
            try:
                conn.executemany(self._sql.insert, [{**row, "now": now} for row in batch])
            except sqlite3.IntegrityError as e:
                raise Conflict(messages.bulk_refused(e)) from e

        if batch:
            await self._write(body)
        return ids

    async def get(self, run_id: str) -> Run | None:
        row = await self._db.read_one(self._sql.get, (run_id,))
        return self._run(row) if row is not None else None

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
        sealed = rows.seal_json(self._sealer, "decision", run_id, decision)

        def body(conn: sqlite3.Connection, now: float) -> Row:
            params = {"id": run_id, "now": now, "decision": sealed}
            row: Row | None = conn.execute(self._sql.continue_, params).fetchone()
            if row is not None:
                return row
            row = conn.execute(self._sql.get, (run_id,)).fetchone()
            if row is None:
                raise NotFound(messages.not_found(run_id))
            if rows.is_repeat_continue(row):
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
            if rows.requeue_is_too_soon(row, now=now, force=force, grace=lock_grace_seconds):
                raise Conflict(messages.requeue_too_soon(run_id, lock_grace_seconds))
            params = {"id": run_id, "now": now, "clear": 1 if clear_cancellation else 0}
            updated: Row = conn.execute(self._sql.requeue, params).fetchone()
            return updated

        return self._run(await self._write(body))
