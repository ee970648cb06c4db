"""``GET /runs/{id}/events``: a run's event log, replayed and then followed live (SSE).

Frames are ``id: <seq>``, ``event: <kind>``, ``data: <json>`` where the JSON is
``{"seq", "attempt", "at", "kind", "data"}``; ``Last-Event-ID`` (or ``?after=N``) resumes
after an event, a ``: keep-alive`` comment goes out every ``KEEPALIVE_SECONDS`` without
one, and the stream ends after the final event. ``Accept: application/json`` or
``?stream=false`` answers one page of stored events instead. Visibility is that of
``GET /runs/{id}``; a caller who may see the run but not its content (an approver of
someone else's run) gets the lifecycle details but no handler data.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

import msgspec
from litestar import Response, Router, get
from litestar.params import Parameter
from litestar.response import ServerSentEvent, ServerSentEventMessage

from runq.api import ApiServices
from runq.api.guards import CurrentIdentity, Services, authenticate, visible_run
from runq.api.problems import error_responses
from runq.errors import BadRequest
from runq.model import FINAL_EVENT_KINDS, RunEvent
from runq.store.events import RESERVED_KINDS

KEEPALIVE_SECONDS = 15.0
MAX_PAGE = 1000
_json = msgspec.json.Encoder()


class EventsPage(msgspec.Struct, kw_only=True):
    """``Accept: application/json``: stored events after ``after``; ``final`` when the page
    holds the run's final event (nothing will follow)."""

    events: list[RunEvent]
    next_after: int
    final: bool


def event_seq(text: str, name: str) -> int:
    """An event's seq as a client sent it (``Last-Event-ID``, ``after``); 400 otherwise."""
    text = text.strip()
    if not text.isdigit() or len(text) > 18:
        raise BadRequest(f"{name} must be the seq of an event (a whole number)")
    return int(text)


def _resume_point(after: int | None, last_event_id: str | None) -> int:
    """``Last-Event-ID`` wins over ``?after`` (a reconnecting EventSource sends it)."""
    if last_event_id is not None and last_event_id.strip():
        return event_seq(last_event_id, "Last-Event-ID")
    return after or 0


def for_viewer(event: RunEvent, content: bool) -> RunEvent:
    """Handler data only for callers who may read the run's content."""
    if content or event.data is None or event.kind in RESERVED_KINDS:
        return event
    return msgspec.structs.replace(event, data=None)


def _frame(event: RunEvent) -> ServerSentEventMessage:
    return ServerSentEventMessage(
        id=event.seq, event=event.kind, data=_json.encode(event).decode(), sep="\n"
    )


async def _stream(
    services: ApiServices, run_id: str, after: int, content: bool
) -> AsyncIterator[ServerSentEventMessage]:
    async for event in services.queue.follow(
        run_id, after=after, keepalive_seconds=KEEPALIVE_SECONDS
    ):
        if event is None:
            yield ServerSentEventMessage(comment="keep-alive", data=None, sep="\n")
        else:
            yield _frame(for_viewer(event, content))


def _wants_json(accept: str | None, stream: bool | None) -> bool:
    if stream is not None:
        return not stream
    accept = accept or ""
    return "application/json" in accept and "text/event-stream" not in accept


@get(
    "/{run_id:str}/events",
    summary="Follow a run's events",
    description=(
        "`text/event-stream`: the stored events after `Last-Event-ID` (or `after`), then "
        "live ones until the final event (`completed`, `failed`, `cancelled`). "
        "`Accept: application/json` or `stream=false`: one page of stored events."
    ),
    responses=error_responses(400, 401, 404, 503),
)
async def run_events(
    run_id: str,
    services: Services,
    identity: CurrentIdentity,
    after: Annotated[int | None, Parameter(ge=0, le=2**62, required=False)] = None,
    stream: Annotated[bool | None, Parameter(required=False)] = None,
    limit: Annotated[int, Parameter(ge=1, le=MAX_PAGE)] = MAX_PAGE,
    last_event_id: Annotated[str | None, Parameter(header="Last-Event-ID", required=False)] = None,
    accept: Annotated[str | None, Parameter(header="Accept", required=False)] = None,
) -> Response[EventsPage] | ServerSentEvent:
    run = await visible_run(services, identity, run_id)
    start = _resume_point(after, last_event_id)
    content = identity.can_read_content(run)
    if _wants_json(accept, stream):
        stored = await services.ops.list_events(run.id, after=start, limit=limit)
        events = [for_viewer(e, content) for e in stored]
        return Response(
            EventsPage(
                events=events,
                next_after=events[-1].seq if events else start,
                final=any(e.kind in FINAL_EVENT_KINDS for e in events),
            )
        )
    return ServerSentEvent(
        _stream(services, run.id, start, content),
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def events_router(*, secured: bool) -> Router:
    return Router(
        path="/runs",
        route_handlers=[run_events],
        guards=[authenticate],
        tags=["runs"],
        security=[{"bearer": []}] if secured else None,
    )
