"""Live updates: one server-sent event stream per open page.

Each page that updates in place names its stream in ``<body data-live=...>``; the page's
script (``static/console.js``) opens one ``EventSource`` on it and applies each event to the
elements that carry a matching ``data-live-*`` attribute. One stream per page, not one
poll per number, keeps a wall of open tabs from becoming a request storm.

The overview's stream sends the exporter's cached numbers (see ``overview``) every
``STATS_INTERVAL_SECONDS``, and the chart (``chart``, cached the same way) whenever its
drawing changed, as a ``fragment`` event that replaces the element of the same id. The
runs table and the run page's timeline have streams of their own (``live_runs``).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio
from litestar.response.sse import ServerSentEventMessage

from runq.ui.overview import Overview

#: Seconds between two overview updates: the exporter refreshes no faster than this anyway.
STATS_INTERVAL_SECONDS = 5.0
#: A stream closes after this long; the browser reconnects by itself (``retry``). Bounds
#: how long a forgotten tab holds a connection and re-checks its session on reconnect.
STREAM_LIFETIME_SECONDS = 600.0
RECONNECT_MILLISECONDS = 3000


async def stats_stream(
    read: Callable[[], Awaitable[Overview]],
    *,
    fragments: Callable[[], Awaitable[dict[str, str]]] | None = None,
    interval: float = STATS_INTERVAL_SECONDS,
    lifetime: float = STREAM_LIFETIME_SECONDS,
) -> AsyncIterator[ServerSentEventMessage]:
    """``stats`` events with every overview number, and ``fragment`` events (element id →
    its new HTML) for the parts of the page ``fragments`` draws, sent only when they changed
    since the stream began, until ``lifetime`` has passed."""
    # A deadline rather than a cancel scope: a scope must not stay open across a yield.
    deadline = time.monotonic() + lifetime
    yield ServerSentEventMessage(comment="runq console", retry=RECONNECT_MILLISECONDS)
    shown: dict[str, str] | None = None
    while time.monotonic() < deadline:
        overview = await read()
        yield ServerSentEventMessage(event="stats", data=json.dumps(overview.as_live_data()))
        if fragments is not None:
            drawn = await fragments()
            changed = {k: v for k, v in drawn.items() if shown is not None and shown.get(k) != v}
            if changed:
                yield ServerSentEventMessage(event="fragment", data=json.dumps(changed))
            shown = drawn
        await anyio.sleep(min(interval, max(deadline - time.monotonic(), 0)))
