"""A run's event log on PostgreSQL: append, list and trim."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import asyncpg

from runq.model import (
    Completion,
    Lease,
    NewEvent,
    RunEvent,
)
from runq.seal import Sealer
from runq.store import codec
from runq.store import events as event_rows
from runq.store.postgres.base import EventSeqs, PostgresBase
from runq.store.postgres.connection import Pool
from runq.store.postgres.statements import Statements


class PostgresEvents(PostgresBase):
    """A group of ``Store`` verbs; ``PostgresStore`` composes the groups."""

    async def append_events(self, worker_id: str, lease: Lease, events: Sequence[NewEvent]) -> bool:
        return lease.run_id in await self.append_events_many(worker_id, [(lease, events)])

    async def append_events_many(
        self, worker_id: str, batches: Sequence[tuple[Lease, Sequence[NewEvent]]]
    ) -> set[str]:
        batches = [(lease, events) for lease, events in batches if events]
        if not batches:
            return set()
        last = await self._db.in_transaction(
            lambda con: self._append_in(con, worker_id, batches), verb="append_events"
        )
        for run_id, seq in last.items():
            self._event_seqs.note(run_id, seq)
        return set(last)

    async def _append_in(
        self,
        con: asyncpg.Connection,
        worker_id: str,
        batches: Sequence[tuple[Lease, Sequence[NewEvent]]],
    ) -> dict[str, int]:
        """Reserve the batches' numbers under the fence and insert the events, inside the
        caller's transaction; each appended run's last number."""
        sql = self._sql
        reserved = await con.fetch(
            sql.events_reserve_many,
            worker_id,
            [lease.run_id for lease, _ in batches],
            [lease.attempt for lease, _ in batches],
            [len(events) for _, events in batches],
        )
        last = {row["id"]: row["event_seq"] for row in reserved}
        ids: list[str] = []
        attempts: list[int] = []
        seqs: list[int] = []
        kinds: list[str] = []
        data: list[bytes | None] = []
        for lease, events in batches:
            if lease.run_id not in last:
                continue
            first = last[lease.run_id] - len(events) + 1
            for seq, kind, sealed in event_rows.sealed_batch(
                self._sealer, lease.run_id, first, events
            ):
                ids.append(lease.run_id)
                attempts.append(lease.attempt)
                seqs.append(seq)
                kinds.append(kind)
                data.append(sealed)
        if ids:
            await con.fetchval(
                sql.events_insert_many, ids, attempts, seqs, kinds, data, self.channel
            )
        return last

    async def list_events(self, run_id: str, *, after: int, limit: int) -> list[RunEvent]:
        found = await self._db.fetch(self._sql.events_list, run_id, after, limit, retry=True)
        return [event_rows.to_event(self._sealer, run_id, *row) for row in found]

    async def trim_events(self, run_id: str, level: str, redacted_max_chars: int) -> None:
        if level == "full":
            return
        if level == "redacted":
            stored = [tuple(r) for r in await self._db.fetch(self._sql.events_sealed, run_id)]
            resealed = await anyio.to_thread.run_sync(
                event_rows.redacted, self._sealer, run_id, stored, redacted_max_chars
            )
            if resealed:
                await self._db.fetch(
                    self._sql.events_reseal,
                    run_id,
                    [seq for seq, _ in resealed],
                    [data for _, data in resealed],
                )
            return
        await self._db.fetch(self._sql.events_trim, run_id, level == "none")


#: Trim levels the one-statement completion applies itself (``redacted`` reads the stored
#: values, ``none`` rewrites the ``completed`` row after it: both take the transaction).
_ONE_STATEMENT_LEVELS = (None, "full", "metadata")


async def complete_carrying(
    db: Pool,
    sql: Statements,
    sealer: Sealer,
    worker_id: str,
    ordered: Sequence[Completion],
    known: EventSeqs,
) -> set[str]:
    """``complete_many`` of a batch in which some completions carry events or a trim. One
    statement when every carried event's number is known from ``known`` (the common case:
    runs that emitted only while their handler ran, nothing flushed since the claim or
    since their last append), checked there; what that leaves undecided, or the whole batch
    when a number is unknown, in ``complete_with_events``'s transaction. The ids applied."""
    expected = {c.run_id: known.pop(c.run_id, None) for c in ordered}
    one_statement = all(c.trim_level in _ONE_STATEMENT_LEVELS for c in ordered) and all(
        expected[c.run_id] is not None for c in ordered if c.events
    )
    if not one_statement:
        return await db.in_transaction(
            lambda con: complete_with_events(con, sql, sealer, worker_id, ordered),
            verb="events_complete_many",
        )
    events = _event_columns(sealer, [(c, (expected[c.run_id] or 0) + 1) for c in ordered])
    done = await db.fetch(
        sql.events_complete_one,
        worker_id,
        [c.run_id for c in ordered],
        [c.attempt for c in ordered],
        [codec.seal_answer(sealer, c) for c in ordered],
        [c.termination_reason.value for c in ordered],
        [expected[c.run_id] or 0 for c in ordered],
        [len(c.events) for c in ordered],
        *events,
        [c.run_id for c in ordered if c.trim_level == "metadata"],
    )
    applied = {row["id"] for row in done}
    # Carrying runs left out: fenced off, or their number moved (a cancel request's event
    # came between); the transaction's fence tells which.
    again = [c for c in ordered if c.events and c.run_id not in applied]
    if again:
        applied |= await db.in_transaction(
            lambda con: complete_with_events(con, sql, sealer, worker_id, again),
            verb="events_complete_many",
        )
    return applied


async def complete_with_events(
    con: asyncpg.Connection,
    sql: Statements,
    sealer: Sealer,
    worker_id: str,
    ordered: Sequence[Completion],
) -> set[str]:
    """``complete_many`` of a batch in which some completions carry events or a privacy
    trim, inside the caller's transaction: the numbers of the carried events are reserved
    under the fence, which locks every run of the batch in id order (the lock order: the
    completion after it then waits for no run row), then one statement completes the
    batch, inserts the events and trims the stored ones. The ids the completion applied
    to."""
    carrying = [c for c in ordered if c.events]
    reserved = await con.fetch(
        sql.events_reserve_many,
        worker_id,
        [c.run_id for c in ordered],
        [c.attempt for c in ordered],
        [len(c.events) for c in ordered],
    )
    last = {row["id"]: row["event_seq"] for row in reserved}
    # A run missing from ``last`` is fenced off: neither its events nor its completion
    # are written.
    events = _event_columns(
        sealer, [(c, last[c.run_id] - len(c.events) + 1) for c in carrying if c.run_id in last]
    )
    cleared = [c.run_id for c in ordered if c.trim_level in ("metadata", "none")]
    resealed = await _redacted_stored(con, sql, sealer, ordered)
    reseal_columns = [list(col) for col in zip(*resealed, strict=True)] or [[], [], []]
    done = await con.fetch(
        sql.events_complete_many,
        worker_id,
        [c.run_id for c in ordered],
        [c.attempt for c in ordered],
        [codec.seal_answer(sealer, c) for c in ordered],
        [c.termination_reason.value for c in ordered],
        *events,
        cleared,
        *reseal_columns,
    )
    applied = {row["id"] for row in done}
    wiped = [c.run_id for c in ordered if c.trim_level == "none" and c.run_id in applied]
    if wiped:
        await con.execute(sql.events_wipe_many, wiped)
    return applied


def _event_columns(sealer: Sealer, numbered: Sequence[tuple[Completion, int]]) -> list[list[Any]]:
    """The run ids, seqs, attempts, kinds and sealed data of the events the completions
    carry, each completion's numbered from the seq paired with it."""
    columns: list[list[Any]] = [[], [], [], [], []]
    for c, first in numbered:
        batch = event_rows.settled_batch(
            sealer, c.run_id, first, c.events, c.trim_level, c.redacted_max_chars
        )
        for seq, kind, data in batch:
            for column, value in zip(columns, (c.run_id, seq, c.attempt, kind, data), strict=True):
                column.append(value)
    return columns


async def _redacted_stored(
    con: asyncpg.Connection, sql: Statements, sealer: Sealer, ordered: Sequence[Completion]
) -> list[tuple[str, int, bytes]]:
    """(run id, seq, re-sealed redacted data) of what the batch's ``redacted`` runs stored
    before completing (earlier flushes, earlier attempts)."""
    limits = {c.run_id: c.redacted_max_chars for c in ordered if c.trim_level == "redacted"}
    if not limits:
        return []
    stored = await con.fetch(sql.events_sealed_many, list(limits))
    by_run: dict[str, list[tuple[int, bytes]]] = {}
    for row in stored:
        by_run.setdefault(row["run_id"], []).append((row["seq"], row["data"]))

    def redact() -> list[tuple[str, int, bytes]]:
        return [
            (run_id, seq, data)
            for run_id, found in by_run.items()
            for seq, data in event_rows.redacted(sealer, run_id, found, limits[run_id])
        ]

    return await anyio.to_thread.run_sync(redact) if by_run else []
