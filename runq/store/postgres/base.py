"""What every group of PostgreSQL verbs shares: the pools, the statements built once per
schema (and clock offset), the sealer, declared here so each verb module (a mixin over
this class) type-checks on its own."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import asyncpg

from runq.limits import LimitRules
from runq.model import BudgetBlock, Run
from runq.seal import Sealer
from runq.store import codec
from runq.store.postgres import statements as pg_sql
from runq.store.postgres.claim_head import ClaimHead
from runq.store.postgres.cluster import PrimaryConnector, PrimaryTracker, replication_report
from runq.store.postgres.connection import Pool
from runq.store.postgres.notifications import PostgresNotifications
from runq.store.postgres.statements.cluster import REPLICATION
from runq.store.postgres.statements.fragments import channel_name
from runq.store.replication import ReplicationReport
from runq.store.statements import check_schema

#: The claim path's own connections (opened on the first claim): one per claim loop of the
#: claimer; a ``sync`` claim of a single run waits for one of them (a claim is about a
#: millisecond), so a fleet's connection count does not grow with a third.
CLAIM_CONNECTIONS = 2


def blocked_params(blocked: BudgetBlock | None) -> list[list[str]]:
    """The four text[] parameters of the budget exclusion (empty arrays exclude nothing)."""
    if blocked is None or blocked.empty:
        return [[], [], [], []]
    pairs = sorted(blocked.pairs)
    return [
        sorted(blocked.users),
        sorted(blocked.configurations),
        [u for u, _ in pairs],
        [c for _, c in pairs],
    ]


def clocks_and_running(
    found: Sequence[asyncpg.Record],
) -> tuple[float, float, list[tuple[str, str | None, int]]]:
    """(the transaction's clock, the statement's clock, running counts) from
    ``running_by_component``: its first row carries the clocks and no component."""
    first = next(r for r in found if r["component"] is None)
    return (
        float(first["now"]),
        float(first["clock"]),
        [
            (r["component"], r["concurrency_key"], r["n"])
            for r in found
            if r["component"] is not None
        ],
    )


class EventSeqs(dict[str, int]):
    """Run id → the last event number seen for it (``PostgresBase._event_seqs``). A hint:
    bounded by clearing (a missing entry only costs the slower write), entries leave
    with their run's completion."""

    MAX_RUNS = 65_536

    def note(self, run_id: str, seq: int) -> None:
        if len(self) >= self.MAX_RUNS:
            self.clear()
        self[run_id] = seq


class PostgresBase:
    """The state every PostgreSQL verb group reads; ``PostgresStore`` is the whole store.

    ``min_size``/``max_size`` bound the asyncpg pool; ``command_timeout`` bounds every
    statement (a timeout is ``StoreUnavailable``); ``migration_timeout`` replaces it for
    migration DDL; ``application_name`` shows in ``pg_stat_activity``.
    """

    engine = "postgres"

    def __init__(
        self,
        url: str,
        *,
        schema: str,
        sealer: Sealer,
        min_size: int = 1,
        max_size: int = 10,
        command_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        migration_timeout: float = 3600.0,
        application_name: str = "runq",
        pgbouncer: bool = False,
        listen_url: str = "",
    ) -> None:
        self.url = url
        self._pgbouncer = pgbouncer
        self._listen_url = listen_url
        self.schema = check_schema(schema)
        self.clock_offset_seconds = 0.0
        #: ``[limits]`` applied by this process's claims (set by ``open_store``).
        self.limits = LimitRules()
        self._sealer = sealer
        self._migration_timeout = migration_timeout
        #: The primary every connection of this store (pools and listener) writes to.
        self._tracker = PrimaryTracker(url)
        #: Statement text → its name, for the ``verb`` label of a contention retry.
        self._names: dict[str, str] = {}
        self._db = Pool(
            url,
            min_size=min_size,
            max_size=max_size,
            command_timeout=command_timeout,
            connect_timeout=connect_timeout,
            application_name=application_name,
            pooled=pgbouncer,
            tracker=self._tracker,
            name_of=self._statement_name,
        )
        # Claims on a connection of their own: a wake-up's claim never queues behind
        # completion writes and heartbeats on the shared pool (the start-latency tail).
        # Their commits do not wait for the WAL flush, which was most of a claim's time: a
        # claim lost in a server crash leaves its runs queued with the attempt unspent, the
        # worker's completion is then fenced off and the run executes again, as after a
        # worker crash (at least once). Every later synchronous commit, the completion's
        # included, flushes the claim with it. Submissions and outcomes stay synchronous.
        self._claims = Pool(
            url,
            min_size=1,
            max_size=CLAIM_CONNECTIONS,
            command_timeout=command_timeout,
            connect_timeout=connect_timeout,
            application_name=f"{application_name} claims",
            pooled=pgbouncer,
            synchronous_commit=False,
            tracker=self._tracker,
            name_of=self._statement_name,
        )
        self._claims_opening = asyncio.Lock()
        self._sql_offset = 0.0
        self._sql_cache = pg_sql.build(schema, 0.0)
        self._names.update(pg_sql.names_of(self._sql_cache))
        #: The ``event_seq`` this replica last saw for runs it holds (claim, event append):
        #: a completion carrying events numbers them from it in one statement, checked
        #: there; a run missing here, or whose number moved, takes the longer transaction.
        self._event_seqs = EventSeqs()
        #: Where this store's claims start walking the claim index (``claim_head.py``).
        self._claim_head = ClaimHead()
        self._notifications = PostgresNotifications(
            self.notify, self.channel, self.listen_connector()
        )

    @property
    def channel(self) -> str:
        """The NOTIFY channel of this installation (one per schema)."""
        return channel_name(self.schema)

    @property
    def statements(self) -> pg_sql.Statements:
        """The statement texts this store prepares (also read by bench/explain_claim.py)."""
        # Tests move the clock by assigning clock_offset_seconds; rebuild the texts then.
        if self.clock_offset_seconds != self._sql_offset:
            self._sql_offset = self.clock_offset_seconds
            self._sql_cache = pg_sql.build(self.schema, self._sql_offset)
            self._names.update(pg_sql.names_of(self._sql_cache))
        return self._sql_cache

    def _statement_name(self, sql: str) -> str:
        return self._names.get(sql, "other")

    def _run(self, row: asyncpg.Record) -> Run:
        return codec.row_to_run(row, self._sealer)

    @property
    def listen_url(self) -> str | None:
        """Where LISTEN connects: ``[store] listen_url``, else the store URL unless behind
        PgBouncer (a pooled server connection cannot hold a LISTEN): None, poll only."""
        if self._listen_url:
            return self._listen_url
        return None if self._pgbouncer else self.url

    def notifications(self) -> PostgresNotifications:
        """This installation's channel in this process (``NOTIFY``, ``LISTEN``)."""
        return self._notifications

    async def notify(self, payload: str) -> None:
        """NOTIFY this installation's channel."""
        await self._db.fetchval(self._sql.notify, self.channel, payload)

    def listen_connector(self) -> PrimaryConnector | None:
        """What the ``LISTEN`` connection opens through (on the primary, checked at every
        keepalive), or None where it cannot listen (``listen_url``)."""
        url = self.listen_url
        if url is None:
            return None
        tracker = self._tracker if url == self.url else PrimaryTracker(url, counts=False)
        return PrimaryConnector(url, tracker, application_name="runq-listener")

    @property
    def server(self) -> str:
        return self._tracker.server

    async def connect(self) -> None:
        await self._db.connect()

    async def _claim_pool(self) -> Pool:
        # Opened on the first claim: a replica that serves only the API, and every CLI
        # command, never holds these connections.
        if not self._claims.connected:
            async with self._claims_opening:
                await self._claims.connect()
        return self._claims

    async def close(self) -> None:
        try:
            await self._claims.close()
        finally:
            await self._db.close()

    async def ping(self) -> None:
        """A round trip that also proves the server takes writes: a pooled connection that
        outlived a failover on a server now read-only (behind PgBouncer, a moved DNS name)
        is dropped, and the ping tried again on a fresh one, which finds the primary."""

        async def check(pool: asyncpg.Pool) -> None:
            async with pool.acquire() as con:
                await self._tracker.check(con)

        await self._db.call(check, retry=True, verb="ping")

    async def replication(self) -> ReplicationReport:
        row = await self._db.fetchrow(REPLICATION, retry=True)
        return replication_report(row)

    async def now(self) -> float:
        value: float = await self._db.fetchval(self._sql.now, retry=True)
        return value

    @property
    def _schedule_sql(self) -> pg_sql.ScheduleStatements:
        offset = self.clock_offset_seconds
        if self._schedule_cache is None or self._schedule_cache[0] != offset:
            self._schedule_cache = (offset, pg_sql.build_schedules(self.schema, offset))
            self._names.update(pg_sql.names_of(self._schedule_cache[1]))
        return self._schedule_cache[1]

    #: The short name the verbs use.
    _sql = statements

    _schedule_cache: tuple[float, pg_sql.ScheduleStatements] | None = None
