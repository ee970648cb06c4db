"""Live updates: one server-sent event stream per open page.

Each page that updates in place names its stream in ``<body data-live=...>``; the page's
script (``static/console.js``) opens one ``EventSource`` on it and applies each event to the
elements that carry a matching ``data-live-*`` attribute. One stream per page, not one
poll per number, keeps a wall of open tabs from becoming a request storm.

Today the overview's stream sends the exporter's cached numbers (see ``overview``) every
``STATS_INTERVAL_SECONDS``. The runs table and the run page's event timeline are the seam
for the per-run event stream: when the store can notify "run X changed" (LISTEN on
PostgreSQL, the local hub on SQLite), a feed here turns those notifications into ``row``
and ``event`` messages on the same kind of stream, and the templates already mark the rows
(``data-run-id``) and the timeline (``#timeline``) that such messages update.
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
    interval: float = STATS_INTERVAL_SECONDS,
    lifetime: float = STREAM_LIFETIME_SECONDS,
) -> AsyncIterator[ServerSentEventMessage]:
    """``stats`` events with every overview number, until ``lifetime`` has passed."""
    # A deadline rather than a cancel scope: a scope must not stay open across a yield.
    deadline = time.monotonic() + lifetime
    yield ServerSentEventMessage(comment="runq console", retry=RECONNECT_MILLISECONDS)
    while time.monotonic() < deadline:
        overview = await read()
        yield ServerSentEventMessage(event="stats", data=json.dumps(overview.as_live_data()))
        await anyio.sleep(min(interval, max(deadline - time.monotonic(), 0)))
