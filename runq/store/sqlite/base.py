"""What every group of SQLite verbs shares: the connections, the statements built once for
the schema, the sealer and the clock offset, declared here so each verb module (a mixin
over this class) type-checks on its own."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import msgspec

from runq.flow import FlowRules
from runq.model import BudgetBlock, Run
from runq.seal import Sealer
from runq.store import rows
from runq.store.replication import ReplicationMode, ReplicationReport
from runq.store.sqlite import statements as sql
from runq.store.sqlite.connection import Body, Connections, Row
from runq.store.statements import check_schema

T = TypeVar("T")

_json = msgspec.json.Encoder()


def _blocked_params(blocked: BudgetBlock | None) -> dict[str, str]:
    """The budget exclusion's ``:bu``, ``:bc`` and ``:bp`` (JSON; '[]' excludes nothing)."""
    block = blocked if blocked is not None else BudgetBlock()
    return {
        "bu": _json.encode(sorted(block.users)).decode(),
        "bc": _json.encode(sorted(block.configurations)).decode(),
        "bp": _json.encode(sorted(block.pairs)).decode(),
    }


class SqliteBase:
    """The state every SQLite verb group reads; ``SqliteStore`` is the whole store."""

    engine = "sqlite"
    supports_listen = False

    def __init__(self, path: Path, *, schema: str, sealer: Sealer) -> None:
        self.path = Path(path)
        self.schema = check_schema(schema)
        self.clock_offset_seconds = 0.0
        #: ``[limits]`` applied by this process's claims (set by ``open_store``).
        self.flow = FlowRules()
        self._sealer = sealer
        self._db = Connections(self.path)
        self._sql = sql.build(schema)
        self._schedule_sql = sql.build_schedules(schema)

    async def _write(self, body: Body[T]) -> T:
        return await self._db.write(body, self.clock_offset_seconds)

    async def _read(self, body: Body[T]) -> T:
        return await self._db.read(body, self.clock_offset_seconds)

    def _run(self, row: Row) -> Run:
        return rows.row_to_run(row, self._sealer)

    async def connect(self) -> None:
        await self._db.connect()

    async def close(self) -> None:
        await self._db.close()

    async def ping(self) -> None:
        await self._db.read_one(sql.PING, ())

    @property
    def server(self) -> str:
        return str(self.path)

    async def replication(self) -> ReplicationReport:
        """A file has no standby: an acknowledgement is as durable as its disk."""
        return ReplicationReport(mode=ReplicationMode.NONE, server=self.server)

    async def now(self) -> float:
        row = await self._db.read_one(sql.NOW, (self.clock_offset_seconds,))
        assert row is not None
        value: float = row[0]
        return value
