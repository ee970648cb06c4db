"""Operator verbs on SQLite: workers, stats, health, job lists, reaping, purging, resealing."""

from __future__ import annotations

import sqlite3
from typing import Any

from runq.model import QueueHealth, ReapReport, Run, Stats, Status, WorkerInfo
from runq.seal import SEALED_COLUMNS
from runq.store import codec, messages
from runq.store import events as event_rows
from runq.store.listings import Listing, ListingVerbs
from runq.store.sqlite import statements as sql
from runq.store.sqlite.base import SqliteBase
from runq.store.sqlite.connection import Row

#: Sorts after every character (SQLite compares text as UTF-8 bytes, in code point order),
#: so ``prefix + _LAST_CHARACTER`` bounds every id that starts with ``prefix``.
_LAST_CHARACTER = "\U0010ffff"


class SqliteOperations(ListingVerbs, SqliteBase):
    """A group of ``Store`` verbs; ``SqliteStore`` composes the groups."""

    async def reap_stale(self, *, lock_grace_seconds: float, limit: int) -> ReapReport:
        report = ReapReport()
        if limit <= 0:
            return report
        params: dict[str, Any] = {
            "grace": lock_grace_seconds,
            "limit": limit,
            "err_non_idempotent": messages.REAP_NON_IDEMPOTENT_ERROR,
            "err_no_request": messages.REAP_NO_REQUEST_ERROR,
        }

        def body(conn: sqlite3.Connection, now: float) -> list[Row]:
            return conn.execute(self._sql.reap, {**params, "now": now}).fetchall()

        # The whole pass is one statement under the write lock, so no lease can be renewed
        # between the scan and the update: ``skipped`` stays 0 on this engine.
        for row in sorted(await self._write(body), key=lambda r: r[0]):
            if row[1] == Status.QUEUED:
                report.requeued += 1
                report.requeued_ids.append(row[0])
            else:
                report.dead_lettered += 1
                report.dead_lettered_ids.append(row[0])
        return report

    async def purge_batch(
        self, *, retention_seconds: float, paused_retention_seconds: float, limit: int
    ) -> int:
        with_paused = paused_retention_seconds > 0  # 0 = paused runs wait until decided
        statement = self._sql.purge_with_paused if with_paused else self._sql.purge
        batch = max(int(limit), 1)

        def body(conn: sqlite3.Connection, now: float) -> int:
            params = {"cutoff": now - retention_seconds, "batch": batch}
            if with_paused:
                params["paused_cutoff"] = now - paused_retention_seconds
            deleted: int = conn.execute(statement, params).rowcount
            return deleted

        return await self._write(body)

    async def register_worker(self, info: WorkerInfo) -> None:
        params = {
            "id": info.id,
            "hostname": info.hostname,
            "pid": info.pid,
            "deployment_id": info.deployment_id or "",
            "settings": codec.encode_settings(info.settings),
        }
        await self._write(
            lambda conn, now: conn.execute(self._sql.register_worker, {**params, "now": now})
        )

    async def remove_worker(self, worker_id: str) -> None:
        await self._write(lambda conn, now: conn.execute(self._sql.remove_worker, (worker_id,)))

    async def prune_workers(self, *, max_age_seconds: float) -> int:
        def body(conn: sqlite3.Connection, now: float) -> int:
            count: int = conn.execute(self._sql.prune_workers, (now - max_age_seconds,)).rowcount
            return count

        return await self._write(body)

    async def list_workers(self, *, max_age_seconds: float) -> list[WorkerInfo]:
        def body(conn: sqlite3.Connection, now: float) -> list[Row]:
            return conn.execute(self._sql.list_workers, (now - max_age_seconds,)).fetchall()

        return [codec.row_to_worker(row) for row in await self._read(body)]

    def _counts(self, conn: sqlite3.Connection) -> dict[str, int]:
        return {row[0]: row[1] for row in conn.execute(self._sql.counts)}

    def _oldest_queued(self, conn: sqlite3.Connection, now: float) -> dict[str, float]:
        """Oldest claimable-since age per deployment; a delayed run is not waiting yet."""
        return {
            row[0]: max(now - row[1], 0.0) for row in conn.execute(self._sql.oldest_queued, (now,))
        }

    async def stats(self) -> Stats:
        def body(conn: sqlite3.Connection, now: float) -> Stats:
            ages = self._oldest_queued(conn, now)
            return Stats(
                counts=self._counts(conn),
                oldest_queued_age_seconds=max(ages.values()) if ages else None,
            )

        return await self._read(body)

    async def health(
        self, *, lock_grace_seconds: float, worker_max_age_seconds: float
    ) -> QueueHealth:
        def body(conn: sqlite3.Connection, now: float) -> QueueHealth:
            ages = self._oldest_queued(conn, now)
            expired = conn.execute(
                self._sql.expired_leases, (now - lock_grace_seconds,)
            ).fetchone()[0]
            live = conn.execute(self._sql.live_workers, (now - worker_max_age_seconds,)).fetchone()[
                0
            ]
            return QueueHealth(
                counts=self._counts(conn),
                oldest_queued_age_seconds=max(ages.values()) if ages else None,
                oldest_queued_age_by_deployment=ages,
                expired_leases=expired,
                live_workers=live,
            )

        return await self._read(body)

    async def _read_listing(self, listing: Listing, *, count: bool) -> tuple[int, list[Run]]:
        page_sql, page_args = listing.page_statement(sql.LISTING, self.schema)
        count_sql, count_args = listing.count_statement(sql.LISTING, self.schema)

        def body(conn: sqlite3.Connection, now: float) -> tuple[int, list[Row]]:
            total: int = conn.execute(count_sql, count_args).fetchone()[0] if count else 0
            return total, conn.execute(page_sql, page_args).fetchall()

        total, found = await self._read(body)
        return total, [self._run(r) for r in found]

    async def reseal_page(self, *, after_id: str, limit: int) -> tuple[str | None, int]:
        page = await self._read(
            lambda conn, now: conn.execute(
                self._sql.reseal_select, (after_id, max(int(limit), 1))
            ).fetchall()
        )
        if not page:
            return None, 0
        # (statement, parameters: the new value first, the old one last), opened and
        # re-sealed outside the write lock.
        updates: list[tuple[str, tuple[Any, ...]]] = []
        for row in page:
            for column in SEALED_COLUMNS:
                new = codec.resealed(self._sealer, column, row["id"], row[column])
                if new is not None:
                    updates.append((self._sql.reseal_update[column], (new, row["id"], row[column])))

        last: str = page[-1]["id"]
        # The handler data in the event logs of the same runs (ids in (after_id, last]).
        events_sql = self._sql.events_rotation_select
        key_id = self._sealer.sealing_key_id
        stored = await self._read(
            lambda conn, now: conn.execute(events_sql, (after_id, last, key_id)).fetchall()
        )
        old_data = {(r[0], r[1]): bytes(r[2]) for r in stored}
        for run_id, seq, new in event_rows.resealed_events(self._sealer, stored):
            old = old_data[(run_id, seq)]
            updates.append((self._sql.events_rotation_update, (new, run_id, seq, old)))

        def body(conn: sqlite3.Connection, now: float) -> int:
            return sum(conn.execute(statement, args).rowcount for statement, args in updates)

        resealed = await self._write(body) if updates else 0
        return last, resealed

    async def count_runs(self) -> int:
        row = await self._db.read_one(self._sql.count_runs, ())
        assert row is not None
        count: int = row[0]
        return count

    async def run_ids_with_prefix(self, prefix: str, *, limit: int) -> list[str]:
        params = {"prefix": prefix, "upper": prefix + _LAST_CHARACTER, "limit": max(limit, 1)}

        def body(conn: sqlite3.Connection, now: float) -> list[str]:
            return [row[0] for row in conn.execute(self._sql.ids_with_prefix, params)]

        return await self._read(body)
