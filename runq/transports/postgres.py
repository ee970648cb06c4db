"""The ``postgres`` transport: ``NOTIFY`` to wake, ``LISTEN`` in every replica.

``Notifier`` coalesces wake-ups: a submission carries its ``NOTIFY`` in its own statement
unless another one in flight already does (``take_inline_slot``); the others of a burst
send at most one ``NOTIFY`` per window (5 ms), and always one after the last request of a
burst, so no submission is left to the poll unless a NOTIFY fails. Cancels are sent at
once. ``Listener`` holds one dedicated connection that ``LISTEN``s on the store's channel;
when the connection is lost it reconnects with backoff, ``LISTEN``s again and wakes the
claimers once (anything announced while it was away is found by that claim pass, or by
the poll). Given the store's ``ListenConnector``, it connects only to the writable primary
and its keepalive also checks that the server still is one, so after a failover it
listens on the new primary.

During an outage every replica retries, so the retries must stay cheap for the database
coming back and quiet for the operator: the delay doubles from ``RECONNECT_MIN`` up to
``RECONNECT_MAX`` with jitter (replicas do not retry in step), and is reset only by a
connection that held for ``KEEPALIVE_SECONDS``. The outage is logged once when it starts
(warning) and once when it ends (info, with how long it lasted and how many attempts it
took); each failed attempt in between is a debug line.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

import anyio
import asyncpg
from anyio.abc import TaskStatus

from runq.config import redact_url
from runq.log import get_logger
from runq.metrics import STORE_ERRORS
from runq.transports.base import (
    CANCEL_PREFIX,
    WAKE_MESSAGE,
    ListenableStore,
    ListenConnector,
    parse_message,
)
from runq.transports.follow import feed_for_channel, on_channel_message

log = get_logger(__name__)

COALESCE_WINDOW = 0.005
#: How often the listener proves its connection alive; a dead one is replaced.
KEEPALIVE_SECONDS = 5.0
#: The first reconnect delay and the cap the doubling stops at (seconds, before jitter).
RECONNECT_MIN = 0.1
RECONNECT_MAX = 5.0


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


def is_listenable(store: object) -> TypeGuard[ListenableStore]:
    return bool(getattr(store, "supports_listen", False)) and callable(
        getattr(store, "notify", None)
    )


class Notifier:
    """Coalesced ``NOTIFY 'wake'`` and immediate ``NOTIFY 'cancel:<id>'``."""

    def __init__(self, store: ListenableStore, *, window: float = COALESCE_WINDOW) -> None:
        self._store = store
        self._window = window
        self._pending = anyio.Event()
        self._running = False
        self._last_sent = float("-inf")
        self._inline_in_flight = 0

    def take_inline_slot(self) -> bool:
        """True when the caller should send the wake-up inside its submit statement
        (delivered at commit, no extra round trip), and then call ``inline_done`` after it.

        Yes when no other submission of this process is carrying one right now, so a lone
        producer's every submit wakes the workers at its commit, as fast as a wake-up can
        be: falling back to ``request_wake`` costs a NOTIFY round trip after the commit, or
        up to a window's wait when the coalescer has just sent one (a producer running
        behind its schedule submits back to back, inside one window). Yes as well when
        none went out in the current coalescing window. Concurrent submitters (a burst on
        the API) coalesce as before: one inline wake-up in flight at a time plus at most
        one ``request_wake`` NOTIFY per window."""
        now = time.monotonic()
        if self._inline_in_flight and now - self._last_sent < self._window:
            return False
        self._last_sent = now
        self._inline_in_flight += 1
        return True

    def inline_done(self) -> None:
        """The submission that took an inline slot has finished (committed or failed)."""
        self._inline_in_flight -= 1

    def request_wake(self) -> None:
        """Ask for a wake-up; sent by ``run()`` within the coalescing window."""
        self._pending.set()

    async def wake_now(self) -> None:
        """One NOTIFY now; raises when it fails (``enqueue`` fails the run then)."""
        await self._store.notify(WAKE_MESSAGE)

    async def cancel(self, run_id: str) -> None:
        await self._store.notify(CANCEL_PREFIX + run_id)

    async def run(self) -> None:
        self._running = True
        try:
            while True:
                await self._pending.wait()
                self._pending = anyio.Event()
                await self._send_wake()
                # Requests during the window set the new event: one more NOTIFY after it.
                await anyio.sleep(self._window)
        finally:
            self._running = False

    async def flush(self) -> None:
        """Send a pending wake-up now (on close, so the last submissions are announced)."""
        if self._pending.is_set():
            self._pending = anyio.Event()
            await self._send_wake()

    async def _send_wake(self) -> None:
        self._last_sent = time.monotonic()
        try:
            await self._store.notify(WAKE_MESSAGE)
        except Exception as e:
            # The row is committed; a sweep or the daemons' poll will find it.
            STORE_ERRORS.labels(service="notifier").inc()
            log.warning("notify.failed", error=str(e))


class Listener:
    """``LISTEN`` on the store's channel; calls ``on_wake()`` / ``on_cancel(run_id)``."""

    def __init__(
        self,
        url: str,
        channel: str,
        *,
        on_wake: Callable[[], None],
        on_cancel: Callable[[str], None],
        reconnect_min: float = RECONNECT_MIN,
        reconnect_max: float = RECONNECT_MAX,
        connector: ListenConnector | None = None,
    ) -> None:
        self._url = url
        self._connector = connector
        self._channel = channel
        self._on_wake = on_wake
        self._on_cancel = on_cancel
        self._reconnect_min = reconnect_min
        self._reconnect_max = reconnect_max
        self.connected = False
        self.reconnects = 0
        self._listened_once = False
        self._started_reported = False
        self._connected_at = 0.0
        self._held_for = 0.0
        self._outage: _Outage | None = None
        # Followers of runs in this process wait on the same channel (runq.transports.follow).
        feed_for_channel(channel).attach_listener(lambda: self.connected)

    def _dispatch(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if on_channel_message(self._channel, payload):
            return
        kind, run_id = parse_message(payload)
        if kind == "wake":
            self._on_wake()
        elif kind == "cancel" and run_id is not None:
            self._on_cancel(run_id)

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled, reconnecting forever. Reports started after the first
        LISTEN (or the first failure, so a database outage never blocks the start)."""
        delay = self._reconnect_min
        while True:
            self._held_for = 0.0
            failure: str | None = None
            try:
                await self._listen_once(task_status)
            except CONNECTION_LOST as e:
                failure = str(e) or type(e).__name__
            if self._held_for >= KEEPALIVE_SECONDS:
                # A connection that held was a healthy period: this is a new outage.
                delay = self._reconnect_min
            if failure is not None:
                STORE_ERRORS.labels(service="listener").inc()
                self._note_failure(failure, delay)
            self._report_started(task_status)
            self.connected = False
            await anyio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, self._reconnect_max)

    def _note_failure(self, error: str, delay: float) -> None:
        """The first failure of an outage is a warning; the rest of it, debug lines."""
        if self._outage is None:
            self._outage = _Outage(started=anyio.current_time())
            log.warning(
                "listener.disconnected",
                error=error,
                url=redact_url(self._url),
                retry_in=round(delay, 2),
            )
        else:
            self._outage.failures += 1
            log.debug("listener.retry_failed", error=error, retry_in=round(delay, 2))

    def _note_connected(self) -> None:
        """The end of an outage, logged once with its length and attempts."""
        outage, self._outage = self._outage, None
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

    async def _connect(self) -> Any:
        if self._connector is not None:
            return await self._connector.connect()
        return await asyncpg.connect(
            self._url, timeout=10, server_settings={"application_name": "runq-listener"}
        )

    async def _listen_once(self, task_status: TaskStatus[None]) -> None:
        conn = await self._connect()
        lost = anyio.Event()
        conn.add_termination_listener(lambda _c: lost.set())
        try:
            await conn.add_listener(self._channel, self._dispatch)
            self.connected = True
            self._connected_at = anyio.current_time()
            self._note_connected()
            if self._listened_once:
                self._on_wake()  # whatever was announced while away: one claim pass finds it
            self._listened_once = True
            self._report_started(task_status)
            await self._keepalive(conn, lost)
        finally:
            if self.connected:
                self._held_for = anyio.current_time() - self._connected_at
            self.connected = False
            with anyio.CancelScope(shield=True):
                await _close_quietly(conn)

    async def _keepalive(self, conn: Any, lost: anyio.Event) -> None:
        while True:
            with anyio.move_on_after(KEEPALIVE_SECONDS):
                await lost.wait()
            if lost.is_set():
                raise ConnectionError("listener connection closed")
            with anyio.fail_after(KEEPALIVE_SECONDS):
                if self._connector is not None:
                    await self._connector.check(conn)  # still the primary?
                else:
                    await conn.execute("SELECT 1")


@dataclass
class _Outage:
    started: float
    failures: int = 0

    @property
    def seconds(self) -> float:
        return anyio.current_time() - self.started


async def _close_quietly(conn: Any) -> None:
    try:
        with anyio.move_on_after(2):
            await conn.close()
    except Exception:
        conn.terminate()
