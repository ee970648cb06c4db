"""Operator verbs on PostgreSQL: workers, stats, health, job lists, reaping, purging, resealing."""

from __future__ import annotations

import anyio
import asyncpg

from runq.model import QueueHealth, ReapReport, Run, Stats, WorkerInfo
from runq.seal import SEALED_COLUMNS
from runq.store import codec, messages
from runq.store import events as event_rows
from runq.store.listings import Listing, ListingVerbs
from runq.store.postgres import statements as pg_sql
from runq.store.postgres.base import PostgresBase


def _counts(statuses: list[str] | None, ns: list[int] | None) -> dict[str, int]:
    return dict(zip(statuses or [], ns or [], strict=True))


class PostgresOperations(ListingVerbs, PostgresBase):
    """A group of ``Store`` verbs; ``PostgresStore`` composes the groups."""

    async def reap_stale(self, *, lock_grace_seconds: float, limit: int) -> ReapReport:
        if limit <= 0:
            return ReapReport()
        row = await self._db.fetchone(
            self._sql.reap,
            float(lock_grace_seconds),
            limit,
            messages.REAP_NON_IDEMPOTENT_ERROR,
            messages.REAP_NO_REQUEST_ERROR,
        )
        requeued, dead = list(row["requeued"]), list(row["dead"])
        return ReapReport(
            requeued=len(requeued),
            dead_lettered=len(dead),
            skipped=row["seen"] - len(requeued) - len(dead),
            requeued_ids=requeued,
            dead_lettered_ids=dead,
        )

    async def purge_batch(
        self, *, retention_seconds: float, paused_retention_seconds: float, limit: int
    ) -> int:
        limit = max(int(limit), 1)
        if paused_retention_seconds > 0:  # 0 = paused runs wait until decided
            deleted: int = await self._db.fetchval(
                self._sql.purge_with_paused,
                float(retention_seconds),
                limit,
                float(paused_retention_seconds),
            )
        else:
            deleted = await self._db.fetchval(self._sql.purge, float(retention_seconds), limit)
        return deleted

    async def register_worker(self, info: WorkerInfo) -> None:
        await self._db.fetch(
            self._sql.register_worker,
            info.id,
            info.hostname,
            info.pid,
            info.deployment_id or "",
            codec.encode_settings(info.settings),
        )

    async def remove_worker(self, worker_id: str) -> None:
        await self._db.fetch(self._sql.remove_worker, worker_id)

    async def prune_workers(self, *, max_age_seconds: float) -> int:
        pruned: int = await self._db.fetchval(self._sql.prune_workers, float(max_age_seconds))
        return pruned

    async def list_workers(self, *, max_age_seconds: float) -> list[WorkerInfo]:
        found = await self._db.fetch(self._sql.list_workers, float(max_age_seconds), retry=True)
        return [codec.row_to_worker(r) for r in found]

    async def stats(self) -> Stats:
        row = await self._db.fetchone(self._sql.stats, retry=True)
        return Stats(
            counts=_counts(row["statuses"], row["ns"]),
            oldest_queued_age_seconds=row["oldest_age"],
        )

    async def health(
        self, *, lock_grace_seconds: float, worker_max_age_seconds: float
    ) -> QueueHealth:
        row = await self._db.fetchone(
            self._sql.health, float(lock_grace_seconds), float(worker_max_age_seconds), retry=True
        )
        return QueueHealth(
            counts=_counts(row["statuses"], row["ns"]),
            oldest_queued_age_seconds=row["oldest_age"],
            oldest_queued_age_by_deployment=dict(
                zip(row["deps"] or [], row["ages"] or [], strict=True)
            ),
            expired_leases=row["expired"],
            live_workers=row["live"],
            oldest_transaction_age_seconds=row["xact_age"],
            oldest_transaction_pid=row["xact_pid"],
        )

    async def _read_listing(self, listing: Listing, *, count: bool) -> tuple[int, list[Run]]:
        page_sql, page_args = listing.page_statement(pg_sql.LISTING, self.schema)
        count_sql, count_args = listing.count_statement(pg_sql.LISTING, self.schema)

        async def read(pool: asyncpg.Pool) -> tuple[int, list[asyncpg.Record]]:
            async with pool.acquire() as con:
                total = await con.fetchval(count_sql, *count_args) if count else 0
                return total, await con.fetch(page_sql, *page_args)

        total, found = await self._db.call(read, retry=True, verb="listing")
        return total, [self._run(r) for r in found]

    async def reseal_page(self, *, after_id: str, limit: int) -> tuple[str | None, int]:
        return await self._db.contended(
            lambda: self._reseal_page(after_id, limit), verb="reseal_page"
        )

    async def _reseal_page(self, after_id: str, limit: int) -> tuple[str | None, int]:
        async with self._db.transaction() as con:
            page = await con.fetch(pg_sql.reseal_select(self._sql, limit), after_id)
            if not page:
                return None, 0
            columns: dict[str, list[bytes | None]] = {c: [] for c in SEALED_COLUMNS}
            resealed = 0
            for row in page:
                for column in SEALED_COLUMNS:
                    new = codec.resealed(self._sealer, column, row["id"], row[column])
                    columns[column].append(row[column] if new is None else new)
                    resealed += new is not None
            if resealed:
                await con.execute(
                    self._sql.reseal_update,
                    [r["id"] for r in page],
                    *(columns[c] for c in SEALED_COLUMNS),
                )
            resealed += await self._reseal_events(con, [r["id"] for r in page])
            last: str = page[-1]["id"]
            return last, resealed

    async def _reseal_events(self, con: asyncpg.Connection, run_ids: list[str]) -> int:
        """Re-seal the handler data in the event logs of a rotation page; how many values."""
        key_id = self._sealer.sealing_key_id
        stored = await con.fetch(self._sql.events_rotation_select, run_ids, key_id)
        if not stored:
            return 0
        found = [(r["run_id"], r["seq"], r["data"]) for r in stored]
        resealed = await anyio.to_thread.run_sync(event_rows.resealed_events, self._sealer, found)
        if resealed:
            await con.execute(
                self._sql.events_rotation_update,
                *(list(column) for column in zip(*resealed, strict=True)),
            )
        return len(resealed)

    async def count_runs(self) -> int:
        total: int = await self._db.fetchval(self._sql.count_runs, retry=True)
        return total

    async def run_ids_with_prefix(self, prefix: str, *, limit: int) -> list[str]:
        found = await self._db.fetch(self._sql.ids_with_prefix, prefix, max(limit, 1), retry=True)
        return [row["id"] for row in found]
