"""Following a run from any process that shares its store: its events, then its outcome.

Readers fetch rows by sequence number (``Store.list_events``) and wait between fetches on
an ``EventFeed``, one per store per process, which says when a run may have changed:

- PostgreSQL: the daemon's one listener connection hears ``event:<run id>:<seq>`` on the
  installation's channel (sent by a handler's event batch, and by the transition trigger
  when a run pauses or settles) and wakes the readers of that run at once. A slow poll
  stays underneath for the lifecycle events that send no notification, and for the time
  the listener is reconnecting.
- SQLite (or PostgreSQL without a listener in this process): no notification can reach
  across processes, so readers poll by sequence, a primary-key probe, every
  ``FAST_POLL_SECONDS``.

However many clients follow one run, the feed holds one waiter event per run.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio

from runq.model import FINAL_EVENT_KINDS, FINAL_STATUSES, Run, RunEvent, Status
from runq.store.base import Store

#: Between fetches when no notification can arrive.
FAST_POLL_SECONDS = 0.05
#: Between fetches when the listener is connected (a safety net under the notifications).
LISTENING_POLL_SECONDS = 0.5
#: How many events one fetch reads.
PAGE = 500
#: An idle follower re-reads the run this often, so a run that ended without a final event
#: (purged, or older than the event log) does not keep its followers forever.
STATUS_CHECK_SECONDS = 2.0
#: The prefix of an event notification on the installation's channel.
EVENT_PREFIX = "event:"

#: The longest ``GET /runs/{id}?wait=S`` (a request should not outlive proxies' timeouts).
MAX_WAIT_SECONDS = 60.0
#: What ``GET /runs/{id}?wait=`` and ``Queue.wait`` stop at.
SETTLED_OR_PAUSED = frozenset(FINAL_STATUSES) | {Status.PAUSED}


class _Waiters:
    """The readers of one run waiting on the feed, and the event that wakes them all."""

    __slots__ = ("count", "event")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.count = 0


class EventFeed:
    """Wakes the readers of a run when a notification names it (one per store per process)."""

    def __init__(self) -> None:
        self._waiting: dict[str, _Waiters] = {}
        self._listening: Callable[[], bool] = lambda: False
        self._watchers: list[Callable[[str], None]] = []

    def attach_listener(self, is_connected: Callable[[], bool]) -> None:
        """A listener of this store's channel lives in this process; polls may slow down."""
        self._listening = is_connected

    @property
    def poll_seconds(self) -> float:
        return LISTENING_POLL_SECONDS if self._listening() else FAST_POLL_SECONDS

    def watch_all(self, callback: Callable[[str], None]) -> None:
        """Also call ``callback(run_id)`` for every run a notification names, waiters or
        not (the console's live runs table: any run may be on a page)."""
        self._watchers.append(callback)

    def notify(self, run_id: str) -> None:
        for watcher in self._watchers:
            watcher(run_id)
        waiters = self._waiting.pop(run_id, None)
        if waiters is not None:
            waiters.event.set()

    async def changed(self, run_id: str, timeout: float) -> None:  # noqa: ASYNC109
        """Return when the run may have changed, or after ``timeout`` seconds."""
        waiters = self._waiting.get(run_id)
        if waiters is None:
            waiters = self._waiting[run_id] = _Waiters()
        waiters.count += 1
        try:
            with anyio.move_on_after(timeout):
                await waiters.event.wait()
        finally:
            waiters.count -= 1
            if waiters.count == 0 and self._waiting.get(run_id) is waiters:
                del self._waiting[run_id]


_FEEDS: dict[str, EventFeed] = {}


def feed_key(store: Any) -> str:
    """PostgreSQL: the NOTIFY channel (what the listener knows); SQLite: file and prefix."""
    channel = getattr(store, "channel", None)
    if isinstance(channel, str):
        return channel
    return f"{getattr(store, 'engine', '?')}:{getattr(store, 'path', id(store))}:" + str(
        getattr(store, "schema", "")
    )


def feed_for(store: Any) -> EventFeed:
    key = feed_key(store)
    feed = _FEEDS.get(key)
    if feed is None:
        feed = _FEEDS[key] = EventFeed()
    return feed


def feed_for_channel(channel: str) -> EventFeed:
    feed = _FEEDS.get(channel)
    if feed is None:
        feed = _FEEDS[channel] = EventFeed()
    return feed


def parse_event_message(payload: str) -> str | None:
    """The run id of ``event:<run id>:<seq>``, or None for any other message."""
    if not payload.startswith(EVENT_PREFIX):
        return None
    run_id, _, _seq = payload[len(EVENT_PREFIX) :].rpartition(":")
    return run_id or None


def on_channel_message(channel: str, payload: str) -> bool:
    """The listener's hook: wake the readers of the run an event notification names."""
    run_id = parse_event_message(payload)
    if run_id is None:
        return False
    feed = _FEEDS.get(channel)
    if feed is not None:
        feed.notify(run_id)
    return True


async def follow_events(
    store: Store, run_id: str, *, after: int = 0, keepalive_seconds: float | None = None
) -> AsyncIterator[RunEvent | None]:
    """The run's events after ``after``, stored ones first, then live ones as they are
    written, ending after the final event (``completed``, ``failed``, ``cancelled``).
    Yields ``None`` every ``keepalive_seconds`` without an event (for heartbeats). Also
    ends when the run is gone or is final without a final event in its log."""
    feed = feed_for(store)
    idle_since = last_check = time.monotonic()
    while True:
        batch = await store.list_events(run_id, after=after, limit=PAGE)
        for event in batch:
            yield event
            after = event.seq
            if event.kind in FINAL_EVENT_KINDS:
                return
        now = time.monotonic()
        if batch:
            idle_since = last_check = now
            if len(batch) == PAGE:
                continue
        elif now - last_check >= STATUS_CHECK_SECONDS:
            last_check = now
            if await _ended_without_final_event(store, run_id, after):
                return
        if keepalive_seconds is not None and now - idle_since >= keepalive_seconds:
            idle_since = now
            yield None
        await feed.changed(run_id, feed.poll_seconds)


async def _ended_without_final_event(store: Store, run_id: str, after: int) -> bool:
    run = await store.get(run_id)
    if run is None:
        return True
    if run.status not in FINAL_STATUSES:
        return False
    # Final: its final event may have been written just now; read once more.
    return not await store.list_events(run_id, after=after, limit=1)


async def wait_for_outcome(store: Store, run_id: str, timeout: float | None) -> Run | None:  # noqa: ASYNC109
    """The run as soon as it is final or paused, or as it is after ``timeout`` seconds
    (None: no limit). None when there is no such run."""
    feed = feed_for(store)
    deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
    while True:
        run = await store.get(run_id)
        if run is None or run.status in SETTLED_OR_PAUSED:
            return run
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return run
        pause = feed.poll_seconds if left is None else min(feed.poll_seconds, left)
        await feed.changed(run_id, pause)


async def run_events(store: Store, run_id: str, *, after: int = 0) -> AsyncIterator[RunEvent]:
    """``follow_events`` without the keep-alive ticks (the Python API's iterator)."""
    async for event in follow_events(store, run_id, after=after):
        if event is not None:
            yield event
