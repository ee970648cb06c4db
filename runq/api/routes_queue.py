"""``/queue``: the operator surface (stats, job listing, one job, requeue).

Guards, in this order: a replica without a worker answers 503 before anything else;
then authentication (401); then the admin scope for JWT identities (403).
"""

from __future__ import annotations

from typing import Annotated

from litestar import Router, get, post
from litestar.params import Parameter

from runq.api.guards import Services, authenticate, require_admin, require_worker
from runq.api.listing import decoded_cursor, run_filter
from runq.api.listing_params import (
    ComponentFilter,
    Cursor,
    Limit,
    StatusFilter,
    TextFilter,
    TimeBound,
)
from runq.api.problems import error_responses
from runq.api.schemas import MAX_PAGE, JobsPage, SortOrder, is_plausible_id
from runq.errors import BadRequest, NotFound
from runq.listing import DEFAULT_SORT_BY, SORTABLE_FIELDS
from runq.model import Stats
from runq.ops.views import OPERATOR_VIEW, RunView

_GUARDED = (401, 403, 503)

JobId = Annotated[str, Parameter(description="The job id (equal to the run's run_id).")]


@get(
    "/stats",
    summary="Queue stats",
    description="Job counts by status and the oldest queued job's age in seconds (null when none).",
    responses=error_responses(*_GUARDED),
)
async def queue_stats(services: Services) -> Stats:
    return await services.ops.stats()


@get(
    "/jobs",
    summary="List jobs",
    description=(
        "Paginated, every field. `status` is repeatable (`status=failed` alone is the "
        "dead-letter list); `component`, `session_id`, `user_id`, `deployment_id`, "
        "`created_after` (inclusive) and `created_before` (exclusive) narrow the list. "
        "Sorted by `created_at` (the default), the answer carries `next_cursor` while more "
        "jobs follow: pass it as `cursor` (with `page` 1) for keyset paging that runs "
        "created meanwhile do not shift. Other sorts page with `page` only (a `cursor` "
        "with them is a 400). A page past the last answers an empty `data`."
    ),
    responses=error_responses(400, *_GUARDED),
)
async def list_jobs(
    services: Services,
    status: StatusFilter = None,
    component: ComponentFilter = None,
    session_id: TextFilter = None,
    user_id: TextFilter = None,
    deployment_id: TextFilter = None,
    created_after: TimeBound = None,
    created_before: TimeBound = None,
    cursor: Cursor = None,
    limit: Limit = 20,
    page: Annotated[int, Parameter(ge=1, le=MAX_PAGE, description="Page number, from 1.")] = 1,
    sort_by: Annotated[
        str,
        Parameter(
            description=f"One of {', '.join(sorted(SORTABLE_FIELDS))}; unknown fields are ignored."
        ),
    ] = DEFAULT_SORT_BY,
    sort_order: SortOrder = "desc",
) -> JobsPage:
    # Unknown fields are ignored, as documented (docs/http.md): the default order is
    # more useful to a dashboard that sends its own sort keys than a 400.
    sort_by = sort_by if sort_by in SORTABLE_FIELDS else DEFAULT_SORT_BY
    after = decoded_cursor(cursor)
    if after is not None and (sort_by != "created_at" or page != 1):
        raise BadRequest("cursor pages only with sort_by=created_at and page=1")
    where = run_filter(
        status=status,
        component=component,
        session_id=session_id,
        created_after=created_after,
        created_before=created_before,
        user_id=user_id,
        deployment_id=deployment_id,
    )
    result = await services.ops.list_jobs(
        where=where, page=page, limit=limit, sort_by=sort_by, sort_order=sort_order, after=after
    )
    return JobsPage.from_page(result)


@get(
    "/jobs/{job_id:str}",
    summary="One job",
    description=(
        "Every field, a queued job's reason for waiting, and `error_detail`: the handler's "
        "whole error message, kept sealed whatever `[privacy] level` left in `error`."
    ),
    responses=error_responses(400, 404, *_GUARDED),
)
async def get_job(job_id: JobId, services: Services) -> RunView:
    run = await services.ops.get(job_id) if is_plausible_id(job_id) else None
    if run is None:
        raise NotFound("no such job")
    # The whole error text: this router is admin-only (the guards below), and GET /runs
    # never reads the column.
    return await services.ops.job(run)


@post(
    "/jobs/{job_id:str}/requeue",
    status_code=200,
    summary="Requeue a failed or cancelled job",
    description=(
        "Grants one more execution (`max_attempts = attempt + 1`). Only failed and cancelled "
        "jobs qualify (400 otherwise). A job that failed within `lock_grace_seconds` answers "
        "409 unless `force=true`. A recorded cancel stays unless `clear_cancellation=true`."
    ),
    responses=error_responses(400, 404, 409, *_GUARDED),
)
async def requeue_job(
    job_id: JobId,
    services: Services,
    clear_cancellation: Annotated[
        bool, Parameter(description="Clear a recorded cancel (the explicit operator override).")
    ] = False,
    force: Annotated[
        bool, Parameter(description="Requeue a job that failed within lock_grace_seconds.")
    ] = False,
) -> RunView:
    if not is_plausible_id(job_id):
        raise NotFound("no such job")
    run = await services.queue.requeue(job_id, clear_cancellation=clear_cancellation, force=force)
    # The replica that served the request claims the job at once if it has capacity.
    services.wake()
    return RunView.of(run, OPERATOR_VIEW)


def queue_router(*, secured: bool) -> Router:
    return Router(
        path="/queue",
        route_handlers=[queue_stats, list_jobs, get_job, requeue_job],
        guards=[require_worker, authenticate, require_admin],
        tags=["queue"],
        security=[{"bearer": []}] if secured else None,
    )
