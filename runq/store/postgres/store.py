"""PostgreSQL engine: an asyncpg pool, ``FOR UPDATE SKIP LOCKED`` claims, batched writes.

Every verb is one statement (a few CTEs at most) so each costs one round trip and its
affected rows decide races. The statement texts are in ``statements``, the pool and its
error policy in ``connection``; this module binds parameters and maps rows.
"""

from __future__ import annotations

import asyncpg

from runq.store.migration_files import load_migrations
from runq.store.postgres.base import PostgresBase
from runq.store.postgres.console import PostgresConsole
from runq.store.postgres.events import PostgresEvents
from runq.store.postgres.lifecycle import PostgresLifecycle
from runq.store.postgres.limits import PostgresLimits
from runq.store.postgres.operations import PostgresOperations
from runq.store.postgres.runs import PostgresRuns
from runq.store.postgres.schedules import PostgresSchedules

__all__ = ["PostgresStore"]


class PostgresStore(
    PostgresRuns,
    PostgresLifecycle,
    PostgresLimits,
    PostgresSchedules,
    PostgresEvents,
    PostgresOperations,
    PostgresConsole,
    PostgresBase,
):
    """The ``Store`` protocol on PostgreSQL, one schema per installation.

    ``min_size``/``max_size`` bound the asyncpg pool; ``command_timeout`` bounds every
    statement (a timeout is ``StoreUnavailable``); ``migration_timeout`` replaces it for
    migration DDL; ``application_name`` shows in ``pg_stat_activity``.
    """

    async def migrate(self) -> int:
        """Apply pending migrations in one transaction under a per-schema advisory lock;
        then (when any applied) ``ANALYZE`` every table of the schema, so the planner
        starts from statistics rather than guesses (new indexes on a table that already
        holds rows, above all)."""
        return await self._db.in_transaction(self._migrate_in, verb="migrate")

    async def _migrate_in(self, con: asyncpg.Connection) -> int:
        sql, timeout = self._sql, self._migration_timeout
        await con.execute(sql.migrate_lock, self.schema)
        await con.execute(sql.create_schema, timeout=timeout)
        await con.execute(sql.create_migrations_table)
        done = {r["version"] for r in await con.fetch(sql.applied_versions)}
        applied = 0
        for m in load_migrations("postgres"):
            if m.version in done:
                continue
            await con.execute(m.sql.replace("{schema}", self.schema), timeout=timeout)
            await con.execute(sql.record_migration, m.version, m.name)
            applied += 1
        if applied:
            await con.execute(sql.analyze_tables, timeout=timeout)
        return applied

    async def check_seal_key(self) -> str | None:
        return await self._db.in_transaction(self._check_seal_key_in, verb="check_seal_key")

    async def _check_seal_key_in(self, con: asyncpg.Connection) -> str | None:
        mine = self._sealer.sealing_key_id.hex()
        recorded: str | None = await con.fetchval(self._sql.seal_check_get)
        if recorded is not None and not self._sealer.has_key(bytes.fromhex(recorded)):
            return recorded
        if recorded != mine:
            await con.execute(self._sql.seal_check_put, mine)
        return None

    async def schema_is_current(self) -> bool:
        wanted = {m.version for m in load_migrations("postgres")}
        sql = self._sql

        async def read(pool: asyncpg.Pool) -> set[int]:
            async with pool.acquire() as con:
                if await con.fetchval(sql.migrations_table_exists) is False:
                    return set()
                return {r["version"] for r in await con.fetch(sql.applied_versions)}

        return wanted <= await self._db.call(read, retry=True, verb="schema_is_current")
