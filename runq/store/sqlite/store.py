"""The embedded engine: one SQLite file in WAL mode, shared safely by several processes.

The statement texts are in ``statements`` and the connection and transaction policy in
``connection``; this module binds parameters and maps rows. A write is one short
transaction run as one function on the writer's thread, so its statements cannot be
interleaved and cost one hop between the event loop and the thread.
"""

from __future__ import annotations

import functools
import sqlite3

from runq.store.migration_files import Migration, load_migrations, split_sql
from runq.store.sqlite.base import SqliteBase
from runq.store.sqlite.console import SqliteConsole
from runq.store.sqlite.events import SqliteEvents
from runq.store.sqlite.lifecycle import SqliteLifecycle
from runq.store.sqlite.limits import SqliteLimits
from runq.store.sqlite.operations import SqliteOperations
from runq.store.sqlite.runs import SqliteRuns
from runq.store.sqlite.schedules import SqliteSchedules

__all__ = ["SqliteStore"]


class SqliteStore(
    SqliteRuns,
    SqliteLifecycle,
    SqliteLimits,
    SqliteSchedules,
    SqliteEvents,
    SqliteOperations,
    SqliteConsole,
    SqliteBase,
):
    """``Store`` on one SQLite file. ``schema`` is a table prefix (``{schema}_runs``)."""

    async def migrate(self) -> int:
        await self._write(lambda conn, now: conn.execute(self._sql.create_migrations_table))
        applied = 0
        for migration in load_migrations("sqlite"):
            # One IMMEDIATE transaction per migration, re-checking inside it: a replica that
            # started at the same moment and won the lock has already applied it.
            if await self._write(functools.partial(self._apply, migration)):
                applied += 1
        return applied

    def _apply(self, migration: Migration, conn: sqlite3.Connection, now: float) -> bool:
        if conn.execute(self._sql.migration_applied, (migration.version,)).fetchone():
            return False
        for statement in split_sql(migration.sql.replace("{schema}", self.schema)):
            conn.execute(statement)
        conn.execute(self._sql.record_migration, (migration.version, migration.name, now))
        return True

    async def check_seal_key(self) -> str | None:
        mine = self._sealer.sealing_key_id.hex()

        def body(conn: sqlite3.Connection, now: float) -> str | None:
            row = conn.execute(self._sql.seal_check_get).fetchone()
            if row is not None and not self._sealer.has_key(bytes.fromhex(row[0])):
                recorded: str = row[0]
                return recorded
            if row is None or row[0] != mine:
                conn.execute(self._sql.seal_check_put, (mine, now))
            return None

        return await self._write(body)

    async def schema_is_current(self) -> bool:
        def body(conn: sqlite3.Connection, now: float) -> set[int]:
            if not conn.execute(self._sql.migrations_table_exists).fetchone():
                return set()
            return {row[0] for row in conn.execute(self._sql.applied_versions)}

        applied = await self._read(body)
        return {mig.version for mig in load_migrations("sqlite")} <= applied
