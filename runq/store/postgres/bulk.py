"""Bulk submission on PostgreSQL: new runs written by binary COPY, sealed while they go.

A batch is cut into chunks of ``COPY_CHUNK`` rows, one COPY each, all in the caller's
transaction. While the database writes one chunk, the next is sealed and built: between
slices of ``SEAL_SLICE`` rows the event loop lets the COPY in flight send its rows and
read its answers. Python's share of a bulk submit (sealing, building rows) and the
database's (the heap, the indexes) then overlap on two cores instead of adding up; one
COPY of the whole batch made the database wait for Python and Python for the database.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import asyncpg

from runq.model import NewRun, Run
from runq.seal import Sealer
from runq.store import codec
from runq.store.postgres import statements as pg_sql

#: Rows per COPY statement: each costs a round trip, and the first chunk is not overlapped.
COPY_CHUNK = 250
#: Rows sealed between two turns of the event loop while a COPY is in flight.
SEAL_SLICE = 50


def copy_record(v: codec.InsertValues, new: NewRun, now: float) -> tuple[Any, ...]:
    """One row for ``SUBMIT_COPY_COLUMNS``: queued, attempt 0, created and updated now."""
    return (
        v.id,
        v.component_type,
        v.component_id,
        "queued",
        0,
        v.max_attempts,
        v.priority,
        v.session_id,
        v.user_id,
        v.actor,
        v.configuration,
        v.deployment_id,
        v.idempotency_key,
        v.origin,
        now,
        now,
        now + v.delay,
        v.has_request,
        v.payload,
        new.concurrency_key,
        new.timeout_seconds,
    )


class RunCopy:
    """One bulk write of new runs into ``schema``'s run table on one connection."""

    def __init__(self, con: asyncpg.Connection, schema: str, sealer: Sealer, now: float) -> None:
        self._con = con
        self._schema = schema
        self._sealer = sealer
        self._now = now
        self._copying: asyncio.Future[Any] | None = None

    async def write(
        self,
        news: Sequence[NewRun],
        ids: Sequence[str],
        encoded: Sequence[bytes | None],
        positions: Sequence[int],
        *,
        runs: dict[int, Run] | None = None,
    ) -> dict[int, codec.InsertValues]:
        """COPY the runs at ``positions`` of ``news``; returns what was written for each.
        ``runs``: also filled with each written run as a ``Run``, built while the database
        writes its chunk. Raises what the COPY raised (a taken idempotency key:
        ``UniqueViolationError``)."""
        written: dict[int, codec.InsertValues] = {}
        try:
            for start in range(0, len(positions), COPY_CHUNK):
                chunk = positions[start : start + COPY_CHUNK]
                records = await self._build(news, ids, encoded, chunk, written)
                await self._settle()
                self._copying = asyncio.ensure_future(
                    self._con.copy_records_to_table(
                        "runs",
                        schema_name=self._schema,
                        columns=pg_sql.SUBMIT_COPY_COLUMNS,
                        records=records,
                    )
                )
                if runs is not None:
                    await self._describe(news, encoded, chunk, written, runs)
            await self._settle()
        finally:
            await self._quiesce()
        return written

    async def _describe(
        self,
        news: Sequence[NewRun],
        encoded: Sequence[bytes | None],
        chunk: Sequence[int],
        written: dict[int, codec.InsertValues],
        runs: dict[int, Run],
    ) -> None:
        """The chunk's runs as ``Run`` objects, built in slices while its COPY goes out."""
        for start in range(0, len(chunk), SEAL_SLICE):
            await asyncio.sleep(0)  # the COPY in flight sends its rows meanwhile
            for i in chunk[start : start + SEAL_SLICE]:
                runs[i] = codec.fresh_run(news[i], written[i], encoded[i], self._now)

    async def _build(
        self,
        news: Sequence[NewRun],
        ids: Sequence[str],
        encoded: Sequence[bytes | None],
        chunk: Sequence[int],
        written: dict[int, codec.InsertValues],
    ) -> list[tuple[Any, ...]]:
        records: list[tuple[Any, ...]] = []
        for start in range(0, len(chunk), SEAL_SLICE):
            part = chunk[start : start + SEAL_SLICE]
            values = codec.insert_values_many(
                [news[i] for i in part],
                [ids[i] for i in part],
                self._sealer,
                [encoded[i] for i in part],
            )
            for i, v in zip(part, values, strict=True):
                written[i] = v
                records.append(copy_record(v, news[i], self._now))
            if self._copying is not None:
                await asyncio.sleep(0)  # the COPY in flight sends its rows meanwhile
        return records

    async def _settle(self) -> None:
        """Wait for the COPY in flight; raise what it raised."""
        copying, self._copying = self._copying, None
        if copying is not None:
            await copying

    async def _quiesce(self) -> None:
        """On the way out (an error, a cancel): let a COPY in flight finish before the
        caller's transaction rolls back on this connection, without raising its error over
        the one on its way."""
        copying, self._copying = self._copying, None
        if copying is not None and not copying.done():
            await asyncio.wait([copying])
        if copying is not None and not copying.cancelled():
            copying.exception()  # retrieved: no "exception never retrieved" warning
