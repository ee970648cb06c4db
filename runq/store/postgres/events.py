"""A run's event log on PostgreSQL: append, list and trim."""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from runq.model import (
    Lease,
    NewEvent,
    RunEvent,
)
from runq.store import events as event_rows
from runq.store.postgres.base import PostgresBase


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
        sql = self._sql
        async with self._db.transaction() as con:
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
            return set(last)

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
