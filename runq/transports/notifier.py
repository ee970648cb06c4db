"""The ``postgres`` transport's sending side: wake-ups sent over the store's channel,
coalesced. (Receiving is the store's: ``store.notifications().listen``.)

``Notifier`` coalesces wake-ups: a submission carries its ``NOTIFY`` in its own statement
unless another one in flight already does (``take_inline_slot``); the others of a burst
send at most one ``NOTIFY`` per window (5 ms), and always one after the last request of a
burst, so no submission is left to the poll unless a NOTIFY fails. Cancels are sent at
once.
"""

from __future__ import annotations

import time

import anyio

from runq.log import get_logger
from runq.metrics import STORE_ERRORS
from runq.store.notifications import WAKE_MESSAGE, Notifications, cancel_message

log = get_logger(__name__)

COALESCE_WINDOW = 0.005


class Notifier:
    """Coalesced ``NOTIFY 'wake'`` and immediate ``NOTIFY 'cancel:<id>'``."""

    def __init__(self, channel: Notifications, *, window: float = COALESCE_WINDOW) -> None:
        self._channel = channel
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
        await self._channel.send(WAKE_MESSAGE)

    async def cancel(self, run_id: str) -> None:
        await self._channel.send(cancel_message(run_id))

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
            await self._channel.send(WAKE_MESSAGE)
        except Exception as e:
            # The row is committed; a sweep or the daemons' poll will find it.
            STORE_ERRORS.labels(service="notifier").inc()
            log.warning("notify.failed", error=str(e))
