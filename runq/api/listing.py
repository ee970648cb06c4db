"""Filters of the run listings (``GET /runs``, ``GET /queue/jobs``, ``runq jobs list``).

Each value is checked here and turned into a ``RunFilter`` and a ``RunCursor``; a bad one
raises ``BadRequest`` naming it (a 400 over HTTP, a usage error in the CLI), never a
database error. No Litestar here: the CLI imports this module too.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

from runq.errors import BadRequest
from runq.listing import RunCursor, RunFilter
from runq.model import Status

#: ``*``, ``type/*``, ``type/id`` or a glob with ``*`` in the id (as ``[limits]`` patterns,
#: but any printable id, since component ids may hold more than pattern names do).
_COMPONENT_RE = re.compile(r"^(\*|[a-z]+/[^\x00-\x1f\x7f]{1,200})$")
_NAME_RE = re.compile(r"^[^\x00-\x1f\x7f]{0,200}$")

#: A listing's page size: at most 1000 runs.
MAX_LISTING_LIMIT = 1000


def checked_component(value: str | None) -> str | None:
    if value is None:
        return None
    if not _COMPONENT_RE.match(value):
        raise BadRequest(
            "component must be 'type/id', 'type/*', a pattern with '*' in the id, or '*'"
        )
    return value


def checked_text(name: str, value: str | None) -> str | None:
    if value is not None and not _NAME_RE.match(value):
        raise BadRequest(f"{name} must be at most 200 characters without control characters")
    return value


def time_bound(name: str, value: str | None) -> float | None:
    """Epoch seconds, or an ISO 8601 time; a time without a zone is UTC."""
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            at = datetime.fromisoformat(text)
        except ValueError as e:
            raise BadRequest(f"{name} must be epoch seconds or an ISO 8601 time") from e
        seconds = (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()
    if not math.isfinite(seconds):
        raise BadRequest(f"{name} must be a finite time")
    return seconds


def decoded_cursor(value: str | None) -> RunCursor | None:
    if value is None:
        return None
    try:
        return RunCursor.decode(value)
    except ValueError as e:
        raise BadRequest(f"cursor: {e}; pass next_cursor of a previous page as it was") from e


def run_filter(
    *,
    status: list[Status] | None,
    component: str | None,
    session_id: str | None,
    created_after: str | None,
    created_before: str | None,
    user_id: str | None = None,
    deployment_id: str | None = None,
    owner: str | None = None,
) -> RunFilter:
    return RunFilter(
        statuses=tuple(status or ()),
        component=checked_component(component),
        session_id=checked_text("session_id", session_id),
        user_id=checked_text("user_id", user_id),
        deployment_id=checked_text("deployment_id", deployment_id),
        created_after=time_bound("created_after", created_after),
        created_before=time_bound("created_before", created_before),
        owner=owner,
    )
