"""The runs table and the run page, live: new and changed rows, and a run's timeline.

**Runs table.** One stream per open table. It re-reads the table's own query when a hint
says a run may have changed, or every ``FALLBACK_SECONDS`` without one, and sends the new
rows only when they differ from what the page shows. Two things keep open tabs from
becoming a query storm:

- every stream of this process reads through one ``ListingCache``: tabs showing the same
  view share one read per ``LISTING_CACHE_SECONDS``;
- a stream reads at most once per ``MIN_GAP_SECONDS``, however many hints arrive.

The hints come from what the daemon already has: its store's notifications (woken by every
submission, requeue and continue that passes through this replica and, on PostgreSQL, by
what the ``LISTEN`` connection hears: wake-ups, and a run paused or settled on any
replica). Changes no hint covers (a claim on another replica, a run submitted from the
CLI on the SQLite file) show at the next fallback read.

**Timeline.** The run page follows the run's event log (``follow_events``, the same
follower ``GET /runs/{id}/events`` uses) through a console route, since a browser's
``EventSource`` cannot send the API's bearer header; the session cookie authenticates it.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import msgspec
from litestar.response.sse import ServerSentEventMessage

from runq.listing import Page
from runq.model import Run, RunEvent
from runq.store.notifications import Notifications
from runq.ui.chart import ThroughputCache
from runq.ui.live import RECONNECT_MILLISECONDS, STREAM_LIFETIME_SECONDS

#: Without a hint, a table re-reads its query this often (changes no hint covers).
FALLBACK_SECONDS = 3.0
#: A stream reads at most this often, however many hints arrive (bursts coalesce).
MIN_GAP_SECONDS = 0.5
#: Streams showing the same view share a read this long.
LISTING_CACHE_SECONDS = 1.0
#: Views whose last read is kept (the least recently used is dropped beyond that).
LISTING_CACHE_VIEWS = 64
#: A timeline stream sends a comment this often without an event (proxies close idle ones).
TIMELINE_KEEPALIVE_SECONDS = 15.0

_json = msgspec.json.Encoder()


class Follow(Protocol):
    """``Queue.follow``: a run's events, then ``None`` every ``keepalive_seconds`` idle."""

    def __call__(
        self, run_id: str, *, after: int = 0, keepalive_seconds: float | None = None
    ) -> AsyncIterator[RunEvent | None]: ...


class ChangeHint:
    """ "Some run may have changed": one event for every stream of the process, replaced
    each time it fires, so a stream waits on it without a subscription of its own."""

    def __init__(self) -> None:
        self._event: anyio.Event | None = None

    def fire(self, *_: object) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait(self, timeout: float) -> None:  # noqa: ASYNC109
        if self._event is None:
            self._event = anyio.Event()
        event = self._event
        with anyio.move_on_after(timeout):
            await event.wait()


@dataclass
class _Entry:
    read_at: float
    page: Page


class ListingCache:
    """The last read of each view, shared by every stream of the process."""

    def __init__(
        self, seconds: float = LISTING_CACHE_SECONDS, views: int = LISTING_CACHE_VIEWS
    ) -> None:
        self._seconds = seconds
        self._views = views
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._lock = anyio.Lock()

    async def get(self, key: Hashable, read: Callable[[], Awaitable[Page]]) -> Page:
        # One lock for all views: reads are short, and a burst of streams opening on the
        # same view must wait for the first read instead of each sending its own.
        async with self._lock:
            entry = self._entries.get(key)
            if entry is not None and time.monotonic() - entry.read_at < self._seconds:
                self._entries.move_to_end(key)
                return entry.page
            page = await read()
            self._entries[key] = _Entry(time.monotonic(), page)
            self._entries.move_to_end(key)
            while len(self._entries) > self._views:
                self._entries.popitem(last=False)
            return page


@dataclass
class ConsoleState:
    """What the console keeps per app (in ``app.state``): caches and the change hint."""

    throughput: ThroughputCache
    listings: ListingCache = field(default_factory=ListingCache)
    hint: ChangeHint = field(default_factory=ChangeHint)

    def attach(self, notifications: Notifications) -> None:
        """Fire the hint on every wake-up, cancel and event message the store's
        notifications deliver in this process (on PostgreSQL, the listener's too)."""
        notifications.subscribe(self.hint.fire, self.hint.fire)
        notifications.events.watch_all(self.hint.fire)


def page_version(page: Page) -> str:
    """A short digest of what a table shows: the page's rows as they are, and the count."""
    parts = [str(page.total_count)]
    parts.extend(f"{r.id}:{r.status.value}:{r.updated_at!r}:{r.attempt}" for r in page.data)
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


async def rows_stream(
    read: Callable[[], Awaitable[Page]],
    render_rows: Callable[[Page], dict[str, str]],
    hint: ChangeHint,
    *,
    shown: str,
    fallback: float = FALLBACK_SECONDS,
    min_gap: float = MIN_GAP_SECONDS,
    lifetime: float = STREAM_LIFETIME_SECONDS,
) -> AsyncIterator[ServerSentEventMessage]:
    """``rows`` events (the table body and its count, as HTML) whenever the view's rows
    differ from the version ``shown`` (what the page or the last event showed)."""
    deadline = time.monotonic() + lifetime
    yield ServerSentEventMessage(comment="runq console", retry=RECONNECT_MILLISECONDS)
    while time.monotonic() < deadline:
        page = await read()
        version = page_version(page)
        if version != shown:
            shown = version
            data = dict(render_rows(page), version=version)
            yield ServerSentEventMessage(event="rows", data=json.dumps(data))
        await anyio.sleep(min_gap)
        await hint.wait(min(fallback, max(deadline - time.monotonic(), 0)))


def timeline_item(event: RunEvent) -> dict[str, Any]:
    """What the page's script shows of one event (it builds the item with text only)."""
    return {
        "seq": event.seq,
        "attempt": event.attempt,
        "at": event.at,
        "kind": event.kind,
        "data": event.data,
    }


async def timeline_stream(
    follow: Follow,
    run: Run,
    *,
    after: int,
    viewer: Callable[[RunEvent], RunEvent],
    keepalive: float = TIMELINE_KEEPALIVE_SECONDS,
) -> AsyncIterator[ServerSentEventMessage]:
    """The run's events after ``after`` as ``timeline`` events (``id`` = seq, so a
    reconnecting browser resumes where it stopped), ending after the final event.
    ``follow`` is ``Queue.follow``."""
    yield ServerSentEventMessage(comment="runq console", retry=RECONNECT_MILLISECONDS)
    async for event in follow(run.id, after=after, keepalive_seconds=keepalive):
        if event is None:
            yield ServerSentEventMessage(comment="keep-alive")
            continue
        shown = viewer(event)
        yield ServerSentEventMessage(
            id=shown.seq, event="timeline", data=_json.encode(timeline_item(shown)).decode()
        )
