"""What every group of SQLite verbs shares: the connections, the statements built once for
the schema, the sealer and the clock offset, declared here so each verb module (a mixin
over this class) type-checks on its own."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import msgspec

from runq.limits import LimitRules
from runq.model import BudgetBlock, Run
from runq.seal import Sealer
from runq.store import codec
from runq.store.notifications import Notifications
from runq.store.replication import ReplicationMode, ReplicationReport
from runq.store.sqlite import statements as sql
from runq.store.sqlite.connection import Body, Connections, Row
from runq.store.statements import check_schema

T = TypeVar("T")

json_encoder = msgspec.json.Encoder()


def blocked_params(blocked: BudgetBlock | None) -> dict[str, str]:
    """The budget exclusion's ``:bu``, ``:bc`` and ``:bp`` (JSON; '[]' excludes nothing)."""
    block = blocked if blocked is not None else BudgetBlock()
    return {
        "bu": json_encoder.encode(sorted(block.users)).decode(),
        "bc": json_encoder.encode(sorted(block.configurations)).decode(),
        "bp": json_encoder.encode(sorted(block.pairs)).decode(),
    }


class SqliteBase:
    """The state every SQLite verb group reads; ``SqliteStore`` is the whole store."""

    engine = "sqlite"

    def __init__(self, path: Path, *, schema: str, sealer: Sealer) -> None:
        self.path = Path(path)
        self.schema = check_schema(schema)
        self.clock_offset_seconds = 0.0
        #: ``[limits]`` applied by this process's claims (set by ``open_store``).
        self.limits = LimitRules()
        self._sealer = sealer
        self._db = Connections(self.path)
        self._sql = sql.build(schema)
        self._schedule_sql = sql.build_schedules(schema)
        # No channel reaches across processes on a file: delivery stays in this process,
        # and readers of other processes poll.
        self._notifications = Notifications()

    def notifications(self) -> Notifications:
        """Wake-ups, cancels and event messages of this store in this process."""
        return self._notifications

    async def _write(self, body: Body[T]) -> T:
        return await self._db.write(body, self.clock_offset_seconds)

    async def _read(self, body: Body[T]) -> T:
        return await self._db.read(body, self.clock_offset_seconds)

    def _run(self, row: Row) -> Run:
        return codec.row_to_run(row, self._sealer)

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
