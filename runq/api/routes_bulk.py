"""Bulk operator actions: ``POST /queue/jobs/requeue`` and ``POST /queue/jobs/cancel``.

An operator paged at night usually faces many dead letters of one cause, not one; these
verbs take a list of ids and answer one outcome per id, in the order given, so a partial
success is visible instead of hidden behind the first error. Each id is its own store
statement: one id's refusal (already completed, unknown, failed too recently) never
stops the others. Guards are those of ``/queue``: worker replica, authentication, admin.

The per-id functions are public because the operator console's bulk form calls them too.
"""

from __future__ import annotations

from typing import Annotated, Literal

from litestar import Router, post
from msgspec import Meta, Struct

from runq.api.guards import Services, authenticate, require_admin, require_worker
from runq.api.listing import run_filter
from runq.api.problems import error_responses
from runq.api.schemas import is_plausible_id
from runq.errors import BadRequest, Conflict, InvalidTransition, NotFound, RunqError
from runq.model import Status

#: Most ids one bulk request may name: bounds the statements one request can cause.
MAX_BULK_IDS = 1000

Outcome = Literal[
    "requeued",
    "cancelled",
    "cancel_requested",
    "not_found",
    "conflict",
    "invalid_transition",
    "error",
]

BulkIds = Annotated[list[str], Meta(min_length=1, max_length=MAX_BULK_IDS)]
ShortText = Annotated[str, Meta(max_length=400)]


class BulkFilter(Struct, kw_only=True, forbid_unknown_fields=True):
    """The jobs a bulk action takes when no ids are named: the filters of ``GET /queue/jobs``
    (each narrows; none given matches every job). The newest ``MAX_BULK_IDS`` matches are
    acted on; ``matched`` in the answer says whether more matched than that."""

    status: list[Status] | None = None
    component: ShortText | None = None
    session_id: ShortText | None = None
    user_id: ShortText | None = None
    deployment_id: ShortText | None = None
    created_after: ShortText | None = None
    created_before: ShortText | None = None


class BulkRequeueRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """The jobs to requeue (``ids`` or ``filter``, exactly one) and the two overrides of
    the single-job requeue."""

    ids: BulkIds | None = None
    filter: BulkFilter | None = None
    force: bool = False
    clear_cancellation: bool = False


class BulkCancelRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """The jobs to cancel: ``ids`` or ``filter``, exactly one."""

    ids: BulkIds | None = None
    filter: BulkFilter | None = None


class BulkOutcome(Struct, kw_only=True):
    """What happened to one id; ``status`` is the job's status after the attempt, when known."""

    id: str
    outcome: Outcome
    status: Status | None = None
    detail: str = ""


class BulkResult(Struct, kw_only=True):
    results: list[BulkOutcome]
    #: How many ids got the action (requeued, or cancelled / cancel recorded).
    succeeded: int
    failed: int
    #: With a ``filter``: how many jobs matched it (more than acted on when over the cap).
    matched: int | None = None


async def targets(
    services: Services, ids: list[str] | None, where: BulkFilter | None
) -> tuple[list[str], int | None]:
    """The ids a bulk request names, or the newest ``MAX_BULK_IDS`` jobs its filter matches
    (one indexed page of the listing) and how many matched. Exactly one must be given."""
    if (ids is None) == (where is None):
        raise BadRequest("give either ids (a list of job ids) or filter (the /queue/jobs filters)")
    if ids is not None:
        return ids, None
    assert where is not None
    found = await services.ops.list_jobs(
        where=run_filter(
            status=where.status,
            component=where.component,
            session_id=where.session_id,
            user_id=where.user_id,
            deployment_id=where.deployment_id,
            created_after=where.created_after,
            created_before=where.created_before,
        ),
        limit=MAX_BULK_IDS,
    )
    return [run.id for run in found.data], found.total_count


def _refusal(run_id: str, error: RunqError) -> BulkOutcome:
    """An expected refusal as an outcome; the message names the job's state, never content."""
    if isinstance(error, NotFound):
        return BulkOutcome(id=run_id, outcome="not_found", detail="no such job")
    if isinstance(error, InvalidTransition):
        return BulkOutcome(id=run_id, outcome="invalid_transition", detail=str(error))
    if isinstance(error, Conflict):
        return BulkOutcome(id=run_id, outcome="conflict", detail=str(error))
    return BulkOutcome(id=run_id, outcome="error", detail=type(error).__name__)


def unique_ids(ids: list[str]) -> list[str]:
    """The ids in their first order, each once: a repeated id must not be acted on twice."""
    return list(dict.fromkeys(ids))


async def requeue_each(
    services: Services, ids: list[str], *, force: bool, clear_cancellation: bool
) -> BulkResult:
    results: list[BulkOutcome] = []
    for run_id in unique_ids(ids):
        if not is_plausible_id(run_id):
            results.append(BulkOutcome(id=run_id[:200], outcome="not_found", detail="no such job"))
            continue
        try:
            run = await services.queue.requeue(
                run_id, clear_cancellation=clear_cancellation, force=force
            )
        except (NotFound, InvalidTransition, Conflict) as e:
            results.append(_refusal(run_id, e))
            continue
        results.append(BulkOutcome(id=run_id, outcome="requeued", status=run.status))
    if any(r.outcome == "requeued" for r in results):
        services.wake()  # one wake-up for the batch, not one per job
    return _tally(results, {"requeued"})


async def cancel_each(services: Services, ids: list[str]) -> BulkResult:
    results: list[BulkOutcome] = []
    for run_id in unique_ids(ids):
        if not is_plausible_id(run_id):
            results.append(BulkOutcome(id=run_id[:200], outcome="not_found", detail="no such job"))
            continue
        try:
            run = await services.queue.cancel(run_id)
        except (NotFound, InvalidTransition, Conflict) as e:
            results.append(_refusal(run_id, e))
            continue
        # A running job stops at its next checkpoint: the cancel is recorded, not done.
        outcome: Outcome = "cancel_requested" if run.status is Status.RUNNING else "cancelled"
        results.append(BulkOutcome(id=run_id, outcome=outcome, status=run.status))
    return _tally(results, {"cancelled", "cancel_requested"})


def _tally(results: list[BulkOutcome], good: set[str]) -> BulkResult:
    succeeded = sum(1 for r in results if r.outcome in good)
    return BulkResult(results=results, succeeded=succeeded, failed=len(results) - succeeded)


@post(
    "/requeue",
    status_code=200,
    summary="Requeue many failed or cancelled jobs",
    description=(
        f"Up to {MAX_BULK_IDS} ids, or a `filter` (the filters of `GET /queue/jobs`: the "
        f"newest {MAX_BULK_IDS} matches, `matched` says how many matched); each is requeued "
        "as by `POST /queue/jobs/{id}/requeue` and answered with its own outcome "
        "(`requeued`, `not_found`, `conflict`, `invalid_transition`), in the order given. "
        "Repeated ids are acted on once."
    ),
    responses=error_responses(400, 401, 403, 413, 503),
)
async def bulk_requeue(data: BulkRequeueRequest, services: Services) -> BulkResult:
    ids, matched = await targets(services, data.ids, data.filter)
    result = await requeue_each(
        services, ids, force=data.force, clear_cancellation=data.clear_cancellation
    )
    result.matched = matched
    return result


@post(
    "/cancel",
    status_code=200,
    summary="Cancel many jobs",
    description=(
        f"Up to {MAX_BULK_IDS} ids, or a `filter` as for requeue; each is cancelled as by "
        "`POST /runs/{id}/cancel` and "
        "answered with its own outcome (`cancelled`, `cancel_requested` for a running job, "
        "`not_found`, `conflict` for a completed or failed one), in the order given."
    ),
    responses=error_responses(400, 401, 403, 413, 503),
)
async def bulk_cancel(data: BulkCancelRequest, services: Services) -> BulkResult:
    ids, matched = await targets(services, data.ids, data.filter)
    result = await cancel_each(services, ids)
    result.matched = matched
    return result


def bulk_router(*, secured: bool) -> Router:
    """Mounted beside the ``/queue`` router, with the same guards in the same order."""
    return Router(
        path="/queue/jobs",
        route_handlers=[bulk_requeue, bulk_cancel],
        guards=[require_worker, authenticate, require_admin],
        tags=["queue"],
        security=[{"bearer": []}] if secured else None,
    )


__all__ = [
    "MAX_BULK_IDS",
    "BulkOutcome",
    "BulkResult",
    "bulk_router",
    "cancel_each",
    "requeue_each",
]
