"""A run's event log on SQLite: append, list and trim."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import anyio

from runq.model import (
    Completion,
    Lease,
    NewEvent,
    RunEvent,
)
from runq.seal import Sealer
from runq.store import events as event_rows
from runq.store.sqlite.base import SqliteBase
from runq.store.sqlite.statements import Statements


class SqliteEvents(SqliteBase):
    """A group of ``Store`` verbs; ``SqliteStore`` composes the groups."""

    async def append_events(self, worker_id: str, lease: Lease, events: Sequence[NewEvent]) -> bool:
        fence = {"id": lease.run_id, "attempt": lease.attempt, "worker": worker_id}

        def body(conn: sqlite3.Connection, now: float) -> bool:
            if conn.execute(self._sql.events_fence, fence).fetchone() is None:
                return False
            (last,) = conn.execute(self._sql.events_last_seq, (lease.run_id,)).fetchone()
            batch = event_rows.sealed_batch(self._sealer, lease.run_id, last + 1, events)
            conn.executemany(
                self._sql.events_insert,
                [(lease.run_id, seq, lease.attempt, now, kind, data) for seq, kind, data in batch],
            )
            return True

        return await self._write(body) if events else True

    async def append_events_many(
        self, worker_id: str, batches: Sequence[tuple[Lease, Sequence[NewEvent]]]
    ) -> set[str]:
        def body(conn: sqlite3.Connection, now: float) -> set[str]:
            applied: set[str] = set()
            for lease, events in batches:
                fence = {"id": lease.run_id, "attempt": lease.attempt, "worker": worker_id}
                if not events or conn.execute(self._sql.events_fence, fence).fetchone() is None:
                    continue
                (last,) = conn.execute(self._sql.events_last_seq, (lease.run_id,)).fetchone()
                batch = event_rows.sealed_batch(self._sealer, lease.run_id, last + 1, events)
                conn.executemany(
                    self._sql.events_insert,
                    [
                        (lease.run_id, seq, lease.attempt, now, kind, data)
                        for seq, kind, data in batch
                    ],
                )
                applied.add(lease.run_id)
            return applied

        return await self._write(body) if batches else set()

    async def list_events(self, run_id: str, *, after: int, limit: int) -> list[RunEvent]:
        sql = self._sql.events_list
        found = await self._read(
            lambda conn, now: conn.execute(sql, (run_id, after, limit)).fetchall()
        )
        return [event_rows.to_event(self._sealer, run_id, *row) for row in found]

    async def trim_events(self, run_id: str, level: str, redacted_max_chars: int) -> None:
        if level == "full":
            return
        if level == "redacted":
            sealed_sql = self._sql.events_sealed
            stored = await self._read(
                lambda conn, now: conn.execute(sealed_sql, (run_id,)).fetchall()
            )
            resealed = await anyio.to_thread.run_sync(
                event_rows.redacted, self._sealer, run_id, stored, redacted_max_chars
            )
            updates = [(data, run_id, seq) for seq, data in resealed]
            await self._write(lambda conn, now: conn.executemany(self._sql.events_reseal, updates))
            return
        params = {"id": run_id, "all": level == "none"}
        await self._write(lambda conn, now: conn.execute(self._sql.events_trim, params))


def complete_with_events(
    conn: sqlite3.Connection,
    sql: Statements,
    sealer: Sealer,
    params: dict[str, Any],
    completion: Completion,
) -> bool:
    """One completion of ``complete_many`` that carries events or a privacy trim, inside
    the batch's write transaction: the carried events are numbered after the stored ones
    (before the ``completed`` row the trigger adds), the completion is written, and the
    run's stored events are cut to its ``trim_level``. True when the completion applied."""
    c, run_id = completion, completion.run_id
    fence = {"id": run_id, "attempt": c.attempt, "worker": params["worker"]}
    if conn.execute(sql.events_fence, fence).fetchone() is None:
        return False
    # Read before the carried events are added: those are written redacted already.
    redacted: list[tuple[int, bytes]] = []
    if c.trim_level == "redacted":
        stored = conn.execute(sql.events_sealed, (run_id,)).fetchall()
        redacted = event_rows.redacted(sealer, run_id, stored, c.redacted_max_chars)
    if c.events:
        (last,) = conn.execute(sql.events_last_seq, (run_id,)).fetchone()
        batch = event_rows.settled_batch(
            sealer, run_id, last + 1, c.events, c.trim_level, c.redacted_max_chars
        )
        conn.executemany(
            sql.events_insert,
            [(run_id, seq, c.attempt, params["now"], kind, data) for seq, kind, data in batch],
        )
    if not conn.execute(sql.complete, params).fetchone():
        return False  # the fence held above, in this same write transaction
    if c.trim_level in ("metadata", "none"):
        conn.execute(sql.events_trim, {"id": run_id, "all": c.trim_level == "none"})
    elif redacted:
        conn.executemany(sql.events_reseal, [(data, run_id, seq) for seq, data in redacted])
    return True
