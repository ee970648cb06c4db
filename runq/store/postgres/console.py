"""The operator console's grouped reads on PostgreSQL: final runs per minute, running runs
per worker."""

from __future__ import annotations

from runq.store.postgres.base import PostgresBase
from runq.store.postgres.statements.console import ConsoleStatements, build_console


class PostgresConsole(PostgresBase):
    """A group of ``Store`` verbs; ``PostgresStore`` composes the groups."""

    _console_cache: tuple[float, ConsoleStatements] | None = None

    @property
    def _console_sql(self) -> ConsoleStatements:
        offset = self.clock_offset_seconds
        if self._console_cache is None or self._console_cache[0] != offset:
            self._console_cache = (offset, build_console(self.schema, offset))
        return self._console_cache[1]

    async def finished_per_minute(
        self, *, window_seconds: float
    ) -> tuple[float, list[tuple[float, str, int]]]:
        found = await self._db.fetch(
            self._console_sql.finished_per_minute, float(window_seconds), retry=True
        )
        now = float(found[0]["db_now"]) if found else 0.0
        return now, [
            (float(r["minute"]), r["status"], int(r["n"])) for r in found if r["status"] is not None
        ]

    async def running_by_worker(self) -> dict[str, int]:
        found = await self._db.fetch(self._console_sql.running_by_worker, retry=True)
        return {r["locked_by"]: int(r["n"]) for r in found}
