"""Following the writable primary of a PostgreSQL cluster through a failover.

``[store] url`` may name several servers (``postgresql://h1:5432,h2:5433/db``) or one DNS
name that a cloud moves to the new primary. Every connection runq opens — the pool, the
claim connections, the ``LISTEN`` connection — goes to the server that takes writes:
``target_session_attrs=read-write`` unless the URL asks for ``primary`` (asyncpg tries the
hosts in order and keeps the first that is neither a standby nor read-only), and each new
connection is identified (``PrimaryTracker.check``). A connection that meets a server
that stopped taking writes — SQLSTATE 25006 ``read_only_sql_transaction`` on a write, a
keepalive that finds ``pg_is_in_recovery()``, no writable host left — is dropped, and the
next connection finds the new primary: no restart.

``PrimaryTracker`` is what the store, the pools and the listener share: the address of the
primary this process writes to now (``/readyz``, ``runq status``, the console), and how
often it moved (``runq_store_failovers_total``, a ``store.primary_changed`` line per move).
A move is a new address: a primary restarted in place is not one, and neither is a
failover behind one virtual IP (the connections still drop and reconnect; only the count
and the log line cannot tell).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import asyncpg
import asyncpg.exceptions as pgerr

from runq.config import WRITABLE_TARGETS, redact_url, target_session_attrs
from runq.log import get_logger
from runq.metrics import STORE_FAILOVERS, STORE_PRIMARY
from runq.store.postgres.statements.cluster import REPLICATION, WHOAMI
from runq.store.replication import ReplicationReport, Standby, replication_mode

log = get_logger(__name__)

TARGET_SESSION_ATTRS = "target_session_attrs"
#: Seconds a listener connection may take to open (the pools use ``connect_timeout``).
CONNECT_TIMEOUT = 10.0


class NotPrimary(ConnectionError):
    """The server reached does not take writes (a standby, a demoted or fenced primary), or
    none of the URL's hosts does right now. An outage for callers: nothing was written."""


#: Errors that say "this server does not take writes": the statement was refused, so it
#: may be tried again on a connection to the new primary.
NOT_PRIMARY: tuple[type[BaseException], ...] = (
    NotPrimary,
    pgerr.ReadOnlySQLTransactionError,
    pgerr.TargetServerAttributeNotMatched,
)


#: What a connect that found no writable server says (asyncpg's words name an enum).
NO_WRITABLE_SERVER = "no server of the URL takes writes now (each is down, a standby or read-only)"


def outage_detail(error: BaseException) -> str:
    """The words for an outage, in the operator's terms."""
    if isinstance(error, pgerr.TargetServerAttributeNotMatched):
        return NO_WRITABLE_SERVER
    return str(error) or type(error).__name__


def connect_options(url: str) -> dict[str, str]:
    """asyncpg connect arguments that keep a connection on the writable primary."""
    if target_session_attrs(url) is not None:
        return {}  # the configuration accepted only a writable target
    return {TARGET_SESSION_ATTRS: WRITABLE_TARGETS[0]}


def server_address(host: str | None, port: int | None) -> str:
    """``host:port`` as the server sees its side of the connection."""
    if host is None:
        return "local socket" if port is None else f"local socket :{port}"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class ServerState:
    address: str
    in_recovery: bool
    read_only: bool

    @property
    def writable(self) -> bool:
        return not (self.in_recovery or self.read_only)

    @property
    def role(self) -> str:
        return "standby" if self.in_recovery else "read-only primary"


async def identify(conn: asyncpg.Connection) -> ServerState:
    row = await conn.fetchrow(WHOAMI)
    return ServerState(
        address=server_address(row["host"], row["port"]),
        in_recovery=bool(row["in_recovery"]),
        read_only=bool(row["read_only"]),
    )


class PrimaryTracker:
    """The primary this process writes to, as its connections find it.

    One per URL: the same server may show another address through another route (through
    PgBouncer on the database host, over its Unix socket; directly, over the network), so
    connections made through two URLs must not be compared. Only the store URL's tracker
    ``counts`` moves (the metric, the log line); the listener's on a ``listen_url`` of its
    own only keeps its connection on a writable server."""

    def __init__(self, url: str, *, counts: bool = True) -> None:
        self.url = redact_url(url)
        self._counts = counts
        #: ``host:port`` of the primary of the last connection made ("" before the first).
        self.server = ""
        #: Moves to another primary seen by this process.
        self.failovers = 0
        self._lost_reported = ""

    async def check(self, conn: asyncpg.Connection) -> None:
        """Identify a connection: note its server when it takes writes, else raise
        ``NotPrimary``. The pools run it on every new connection; the listener on its
        connection and at every keepalive."""
        state = await identify(conn)
        if not state.writable:
            self.lost(f"{state.address} is a {state.role}")
            raise NotPrimary(f"{state.address} does not take writes: it is a {state.role}")
        if self.observe(state.address):
            # What the new primary promises may differ (a standby promoted alone often
            # runs without a synchronous standby until the old primary rejoins).
            row = await conn.fetchrow(REPLICATION)
            replication_report(row).log()

    def observe(self, address: str) -> bool:
        """A connection reached the writable primary at ``address``; True when that is a
        move from another primary."""
        if address == self.server:
            return False
        previous, self.server = self.server, address
        self._lost_reported = ""
        if not self._counts:
            return False
        STORE_PRIMARY.clear()
        STORE_PRIMARY.labels(server=address).set(1)
        if not previous:
            return False  # the first connection of this process: nothing moved
        self.failovers += 1
        STORE_FAILOVERS.inc()
        log.warning(
            "store.primary_changed",
            previous=previous,
            primary=address,
            failovers=self.failovers,
            url=self.url,
        )
        return True

    def lost(self, reason: str) -> None:
        """A connection met a server that stopped taking writes: logged once per primary."""
        if self._lost_reported == self.server:
            return
        self._lost_reported = self.server
        log.warning("store.primary_lost", primary=self.server or None, reason=reason)

    def noticed(self, error: BaseException) -> None:
        """An error on a pooled connection: report it when it says "not the primary"."""
        if isinstance(error, NOT_PRIMARY):
            self.lost(str(error) or type(error).__name__)


class PrimaryConnector:
    """Opens the ``LISTEN`` connection on the writable primary and proves, at every
    keepalive, that its server still is one (the store's ``Listener`` uses it)."""

    def __init__(self, url: str, tracker: PrimaryTracker, *, application_name: str) -> None:
        self._url = url
        self._tracker = tracker
        self._application_name = application_name

    @property
    def target(self) -> str:
        return redact_url(self._url)

    async def connect(self) -> asyncpg.Connection:
        try:
            conn = await asyncpg.connect(
                self._url,
                timeout=CONNECT_TIMEOUT,
                server_settings={"application_name": self._application_name},
                **connect_options(self._url),
            )
        except pgerr.TargetServerAttributeNotMatched as e:
            raise NotPrimary(f"{self.target}: {NO_WRITABLE_SERVER}") from e
        try:
            await self._tracker.check(conn)
        except BaseException:
            conn.terminate()
            raise
        return conn

    async def check(self, conn: asyncpg.Connection) -> None:
        await self._tracker.check(conn)


def replication_report(row: asyncpg.Record) -> ReplicationReport:
    """``ReplicationReport`` from the ``REPLICATION`` statement's row."""
    standbys = tuple(
        Standby(name=s["name"], state=s["state"], sync_state=s["sync_state"])
        for s in json.loads(row["standbys"])
    )
    names, commit = row["standby_names"], row["synchronous_commit"]
    return ReplicationReport(
        mode=replication_mode(names, commit, len(standbys)),
        server=server_address(row["host"], row["port"]),
        synchronous_standby_names=names,
        synchronous_commit=commit,
        standbys=standbys,
    )


__all__ = [
    "NOT_PRIMARY",
    "NotPrimary",
    "PrimaryConnector",
    "PrimaryTracker",
    "connect_options",
    "outage_detail",
    "replication_report",
]
