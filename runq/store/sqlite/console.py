"""The operator console's grouped reads on SQLite: final runs per minute, running runs per
worker."""

from __future__ import annotations

import sqlite3

from runq.store.sqlite.base import SqliteBase
from runq.store.sqlite.connection import Row
from runq.store.sqlite.statements.console import ConsoleStatements, build_console


class SqliteConsole(SqliteBase):
    """A group of ``Store`` verbs; ``SqliteStore`` composes the groups."""

    _console_statements: ConsoleStatements | None = None

    @property
    def _console_sql(self) -> ConsoleStatements:
        if self._console_statements is None:
            self._console_statements = build_console(self.schema)
        return self._console_statements

    async def finished_per_minute(
        self, *, window_seconds: float
    ) -> tuple[float, list[tuple[float, str, int]]]:
        statement = self._console_sql.finished_per_minute

        def body(conn: sqlite3.Connection, now: float) -> tuple[float, list[Row]]:
            return now, conn.execute(statement, {"since": now - window_seconds}).fetchall()

        now, found = await self._read(body)
        return now, [(float(r[0]), r[1], int(r[2])) for r in found]

    async def running_by_worker(self) -> dict[str, int]:
        statement = self._console_sql.running_by_worker

        def body(conn: sqlite3.Connection, now: float) -> list[Row]:
            return conn.execute(statement).fetchall()

        return {r[0]: int(r[1]) for r in await self._read(body)}
