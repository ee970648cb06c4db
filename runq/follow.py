"""Following a run from any process that shares its store: its events, then its outcome.

Readers fetch rows by sequence number (``Store.list_events``) and wait between fetches on
the store's ``EventFeed`` (``store.notifications().events``), which says when a run may
have changed:

- PostgreSQL, with the daemon's listener connected in this process: an
  ``event:<run id>:<seq>`` message on the installation's channel (sent by a handler's
  event batch, and by the transition trigger when a run pauses or settles) wakes the
  readers of that run at once. A slow poll stays underneath for the lifecycle events that
  send no message, and for the time the listener is reconnecting.
- SQLite (or PostgreSQL without a listener in this process): no message reaches across
  processes, so readers poll by sequence, a primary-key probe, every
  ``FAST_POLL_SECONDS``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from runq.model import FINAL_EVENT_KINDS, FINAL_STATUSES, Run, RunEvent, Status
from runq.store.base import Store

#: How many events one fetch reads.
PAGE = 500
#: An idle follower re-reads the run this often, so a run that ended without a final event
#: (purged, or older than the event log) does not keep its followers forever.
STATUS_CHECK_SECONDS = 2.0

#: The longest ``GET /runs/{id}?wait=S`` (a request should not outlive proxies' timeouts).
MAX_WAIT_SECONDS = 60.0
#: What ``GET /runs/{id}?wait=`` and ``Queue.wait`` stop at.
SETTLED_OR_PAUSED = frozenset(FINAL_STATUSES) | {Status.PAUSED}


async def follow_events(
    store: Store, run_id: str, *, after: int = 0, keepalive_seconds: float | None = None
) -> AsyncIterator[RunEvent | None]:
    """The run's events after ``after``, stored ones first, then live ones as they are
    written, ending after the final event (``completed``, ``failed``, ``cancelled``).
    Yields ``None`` every ``keepalive_seconds`` without an event (for heartbeats). Also
    ends when the run is gone or is final without a final event in its log."""
    feed = store.notifications().events
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
    feed = store.notifications().events
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
