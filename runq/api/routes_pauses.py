"""``/queue/pauses``: pause and resume a component pattern or a deployment fleet-wide.

A pause is a row every claim consults, so it takes effect with the next claim on every
replica; runs already running finish. Guards are those of ``/queue``: worker replica,
authentication, admin.
"""

from __future__ import annotations

from typing import Annotated

from litestar import Response, Router, delete, get, post
from litestar.params import Parameter
from msgspec import Meta, Struct

from runq.api.guards import CurrentIdentity, Services, authenticate, require_admin, require_worker
from runq.api.problems import error_responses
from runq.errors import BadRequest, NotFound
from runq.limits import MAX_PAUSE_REASON_CHARS, pause_target_problem
from runq.model import Pause

_GUARDED = (401, 403, 503)


class PauseRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """Exactly one of ``component`` (a pattern as in ``[routing]``) and ``deployment``."""

    component: str | None = None
    deployment: str | None = None
    reason: Annotated[str, Meta(max_length=MAX_PAUSE_REASON_CHARS)] | None = None


class PauseList(Struct, kw_only=True):
    data: list[Pause]


def _target(data: PauseRequest) -> tuple[str, str]:
    if (data.component is None) == (data.deployment is None):
        raise BadRequest("give exactly one of component and deployment")
    if data.component is not None:
        kind, target = "component", data.component
    else:
        kind, target = "deployment", data.deployment or ""
    problem = pause_target_problem(kind, target)
    if problem is not None:
        raise BadRequest(problem)
    return kind, target


@get("/", summary="Active pauses", responses=error_responses(*_GUARDED))
async def list_pauses(services: Services) -> PauseList:
    return PauseList(data=await services.ops.list_pauses())


@post(
    "/",
    summary="Pause a component pattern or a deployment",
    description=(
        "Claims skip the matching queued runs from now on, on every replica; running runs "
        "finish. 201 with the new pause, or 200 with the existing one when already paused."
    ),
    responses=error_responses(400, *_GUARDED),
)
async def add_pause(
    data: PauseRequest, services: Services, identity: CurrentIdentity
) -> Response[Pause]:
    kind, target = _target(data)
    pause, created = await services.ops.add_pause(
        kind, target, reason=data.reason, created_by=identity.user_id
    )
    return Response(pause, status_code=201 if created else 200)


@delete(
    "/{pause_id:str}",
    status_code=200,
    summary="Resume: delete a pause",
    responses=error_responses(400, 404, *_GUARDED),
)
async def remove_pause(
    pause_id: Annotated[str, Parameter(description="The pause id.")],
    services: Services,
) -> Pause:
    # An id longer than any pause id names no pause (never sent to the database).
    pause = None if len(pause_id) > 64 else await services.ops.remove_pause(pause_id)
    if pause is None:
        raise NotFound("no such pause")
    services.wake()  # the paused runs may be claimed at once
    return pause


def pauses_router(*, secured: bool) -> Router:
    """Mounted beside the ``/queue`` router, with the same guards in the same order."""
    return Router(
        path="/queue/pauses",
        route_handlers=[list_pauses, add_pause, remove_pause],
        guards=[require_worker, authenticate, require_admin],
        tags=["queue"],
        security=[{"bearer": []}] if secured else None,
    )
