"""PostgreSQL's notifications: ``NOTIFY`` through the pool, ``LISTEN`` on a connection of
its own, both on the installation's channel (one per schema).

``PostgresNotifications`` is what ``PostgresStore.notifications()`` returns: ``send`` is a
``NOTIFY`` every replica hears; ``listen`` (run by a daemon) holds the ``Listener``, whose
messages go through ``deliver`` to this process's claimers, executors and followers. Where
no direct connection can hold a ``LISTEN`` (behind PgBouncer without ``[store]
listen_url``) ``listen`` returns at once and every reader polls.

The ``Listener`` reconnects for ever. During an outage every replica retries, so the
retries must stay cheap for the database coming back and quiet for the operator: the delay
doubles from ``RECONNECT_MIN`` up to ``RECONNECT_MAX`` with jitter (replicas do not retry in
step), and is reset only by a connection that held for ``KEEPALIVE_SECONDS``. The outage is
logged once when it starts (warning) and once when it ends (info, with how long it lasted
and how many attempts it took); each failed attempt in between is a debug line. After a
reconnection it delivers one ``wake``: anything announced while it was away is found by
that claim pass, or by the poll. It connects through the store's ``PrimaryConnector``
(``cluster.py``): only to the writable primary, and its keepalive also proves the server
still is one, so after a failover it listens on the new primary.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import anyio
import asyncpg
from anyio.abc import TaskStatus

from runq.log import get_logger
from runq.loops import LISTENER_BACKOFF, OUTAGE_LOG, Backoff
from runq.metrics import STORE_ERRORS
from runq.store.notifications import WAKE_MESSAGE, Notifications
from runq.store.postgres.connection import is_outage

log = get_logger(__name__)

#: What ends a listening connection (the listener then reconnects). InternalClientError:
#: a keepalive sent while the connection was still taking in the error that ended it (the
#: server's "terminating connection" at a crash or failover).
CONNECTION_LOST: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)


class ListenConnector(Protocol):
    """How the listener opens its connection and proves it still good: the store's
    ``cluster.PrimaryConnector`` (on the writable primary, through a failover)."""

    @property
    def target(self) -> str:
        """Where it connects, for logs (no password)."""

    async def connect(self) -> asyncpg.Connection: ...

    async def check(self, conn: asyncpg.Connection) -> None:
        """Raises when the connection is dead or its server no longer takes writes."""


#: How often the listener proves its connection alive; a dead one is replaced.
KEEPALIVE_SECONDS = 5.0
#: The first reconnect delay and the cap the doubling stops at (seconds, before jitter).
RECONNECT_MIN = LISTENER_BACKOFF.base
RECONNECT_MAX = LISTENER_BACKOFF.cap


class PostgresNotifications(Notifications):
    """``NOTIFY`` with ``send`` (``notify``: the store's pool), ``LISTEN`` with ``listen``."""

    crosses_processes = True

    def __init__(
        self,
        notify: Callable[[str], Awaitable[None]],
        channel: str,
        connector: ListenConnector | None,
    ) -> None:
        super().__init__()
        self._notify = notify
        self.channel = channel
        self._connector = connector
        self.listener: Listener | None = None

    async def send(self, payload: str) -> None:
        """One ``NOTIFY`` on the channel; raises when it cannot be sent."""
        await self._notify(payload)

    @property
    def listening(self) -> bool:
        return self.listener is not None and self.listener.connected

    async def listen(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        if self._connector is None:
            task_status.started()  # behind PgBouncer with no direct URL: readers poll
            return
        self.listener = Listener(self._connector, self.channel, deliver=self.deliver)
        await self.listener.run(task_status=task_status)


class Listener:
    """``LISTEN`` on the store's channel on a connection of its own; hands every message to
    ``deliver`` (``Notifications.deliver``)."""

    def __init__(
        self,
        connector: ListenConnector,
        channel: str,
        *,
        deliver: Callable[[str], None],
        backoff: Backoff = LISTENER_BACKOFF,
    ) -> None:
        #: Opens the connection on the writable primary and proves it still is one.
        self._connector = connector
        self._channel = channel
        self._deliver = deliver
        self._backoff = backoff
        self.connected = False
        self.reconnects = 0
        self._listened_once = False
        self._started_reported = False
        self._connected_at = 0.0
        self._held_for = 0.0
        self._outage: _Outage | None = None

    def _dispatch(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self._deliver(payload)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled, reconnecting forever. Reports started after the first
        LISTEN (or the first failure, so a database outage never blocks the start)."""
        attempts = 0
        while True:
            self._held_for = 0.0
            failure: BaseException | None = None
            try:
                await self._listen_once(task_status)
            except CONNECTION_LOST as e:
                failure = e
            if self._held_for >= KEEPALIVE_SECONDS:
                # A connection that held was a healthy period: this is a new outage.
                attempts = 0
            attempts += 1
            if failure is not None:
                STORE_ERRORS.labels(service="listener").inc()
                self._note_failure(failure, self._backoff.ceiling(attempts))
            self._report_started(task_status)
            self.connected = False
            await anyio.sleep(self._backoff.delay(attempts))

    def _note_failure(self, failure: BaseException, delay: float) -> None:
        """The first failure of an outage is one line (a warning of the process's outage
        log when the database is away, ``store.unreachable``; else a warning of its own);
        the rest of it, debug lines."""
        error = str(failure) or type(failure).__name__
        if self._outage is None:
            self._outage = _Outage(started=anyio.current_time())
            outage = is_outage(failure)
            if outage:
                OUTAGE_LOG.unreachable("listener", failure)
            (log.info if outage else log.warning)(
                "listener.disconnected",
                error=error,
                url=self._connector.target,
                retry_in=round(delay, 2),
            )
        else:
            self._outage.failures += 1
            log.debug("listener.retry_failed", error=error, retry_in=round(delay, 2))

    def _note_connected(self) -> None:
        """The end of an outage, logged once with its length and attempts."""
        outage, self._outage = self._outage, None
        OUTAGE_LOG.reachable("listener")
        if self._listened_once:
            self.reconnects += 1
            log.info(
                "listener.reconnected",
                channel=self._channel,
                outage_seconds=None if outage is None else round(outage.seconds, 1),
                failed_attempts=None if outage is None else outage.failures + 1,
            )
        else:
            log.info("listener.listening", channel=self._channel)

    def _report_started(self, task_status: TaskStatus[None]) -> None:
        if not self._started_reported:
            self._started_reported = True
            task_status.started()

    async def _listen_once(self, task_status: TaskStatus[None]) -> None:
        conn = await self._connector.connect()
        lost = anyio.Event()
        conn.add_termination_listener(lambda _c: lost.set())
        try:
            await conn.add_listener(self._channel, self._dispatch)
            self.connected = True
            self._connected_at = anyio.current_time()
            self._note_connected()
            if self._listened_once:
                # Whatever was announced while away: one claim pass finds it.
                self._deliver(WAKE_MESSAGE)
            self._listened_once = True
            self._report_started(task_status)
            await self._keepalive(conn, lost)
        finally:
            if self.connected:
                self._held_for = anyio.current_time() - self._connected_at
            self.connected = False
            with anyio.CancelScope(shield=True):
                await _close_quietly(conn)

    async def _keepalive(self, conn: asyncpg.Connection, lost: anyio.Event) -> None:
        while True:
            with anyio.move_on_after(KEEPALIVE_SECONDS):
                await lost.wait()
            if lost.is_set():
                raise ConnectionError("listener connection closed")
            with anyio.fail_after(KEEPALIVE_SECONDS):
                await self._connector.check(conn)  # alive, and still the primary


@dataclass
class _Outage:
    started: float
    failures: int = 0

    @property
    def seconds(self) -> float:
        return anyio.current_time() - self.started


async def _close_quietly(conn: asyncpg.Connection) -> None:
    try:
        with anyio.move_on_after(2):
            await conn.close()
    except Exception:
        conn.terminate()
