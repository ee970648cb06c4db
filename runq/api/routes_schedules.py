"""``/queue/schedules``: the configured schedules, paused and resumed for the whole fleet.

Guards: authentication (401), then the admin scope for JWT identities (403). Unlike the
rest of ``/queue`` a replica without a worker answers too: schedules live in the database,
not in a worker.
"""

from __future__ import annotations

from typing import Annotated

from litestar import Router, get, post
from litestar.params import Parameter

from runq.api.guards import Services, authenticate, require_admin
from runq.api.problems import error_responses
from runq.ops.schedules import ScheduleView

ScheduleName = Annotated[str, Parameter(description="The schedule's name in [[schedules]].")]


@get(
    "/",
    summary="List schedules",
    description=(
        "Each `[[schedules]]` entry with its state in the database: paused or not, the next "
        "slot due, the latest slot recorded and the run it made (null when the overlap rule "
        "skipped it). Times are epoch seconds."
    ),
    responses=error_responses(400, 401, 403),
)
async def list_schedules(services: Services) -> list[ScheduleView]:
    return await services.ops.schedules()


@post(
    "/{name:str}/pause",
    status_code=200,
    summary="Pause a schedule fleet-wide",
    description="No replica fires it until resumed; runs it already made are untouched.",
    responses=error_responses(400, 401, 403, 404),
)
async def pause_schedule(name: ScheduleName, services: Services) -> ScheduleView:
    return await services.ops.set_schedule_paused(name, paused=True)


@post(
    "/{name:str}/resume",
    status_code=200,
    summary="Resume a schedule",
    description="It fires again from its next slot; slots inside the pause do not fire.",
    responses=error_responses(400, 401, 403, 404),
)
async def resume_schedule(name: ScheduleName, services: Services) -> ScheduleView:
    return await services.ops.set_schedule_paused(name, paused=False)


def schedules_router(*, secured: bool) -> Router:
    return Router(
        path="/queue/schedules",
        route_handlers=[list_schedules, pause_schedule, resume_schedule],
        guards=[authenticate, require_admin],
        tags=["schedules"],
        security=[{"bearer": []}] if secured else None,
    )
