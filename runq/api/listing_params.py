"""The listings' query parameters as Litestar declares them (``GET /runs``, ``/queue/jobs``)."""

from __future__ import annotations

from typing import Annotated

from litestar.params import Parameter

from runq.api.listing import MAX_LISTING_LIMIT
from runq.listing import MAX_CURSOR_CHARS
from runq.model import Status

StatusFilter = Annotated[
    list[Status] | None,
    Parameter(required=False, description="Repeat to match several statuses."),
]
ComponentFilter = Annotated[
    str | None,
    Parameter(
        required=False,
        description="`type/id`, `type/*`, `type/prefix*` (`*` matches any text) or `*`.",
    ),
]
TextFilter = Annotated[str | None, Parameter(required=False, max_length=200)]
TimeBound = Annotated[
    str | None,
    Parameter(
        required=False,
        description="Epoch seconds or an ISO 8601 time (UTC when it names no zone).",
    ),
]
Cursor = Annotated[
    str | None,
    Parameter(
        required=False,
        max_length=MAX_CURSOR_CHARS,
        description="`next_cursor` of the previous page (opaque).",
    ),
]
Limit = Annotated[int, Parameter(ge=1, le=MAX_LISTING_LIMIT, description="Runs per page.")]
