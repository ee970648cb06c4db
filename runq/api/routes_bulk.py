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
from runq.api.problems import error_responses
from runq.api.schemas import is_plausible_id
from runq.errors import Conflict, InvalidTransition, NotFound, RunqError
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


class BulkRequeueRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """The jobs to requeue and the two overrides of the single-job requeue."""

    ids: BulkIds
    force: bool = False
    clear_cancellation: bool = False


class BulkCancelRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    ids: BulkIds


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
        f"Up to {MAX_BULK_IDS} ids; each is requeued as by `POST /queue/jobs/{{id}}/requeue` "
        "and answered with its own outcome (`requeued`, `not_found`, `conflict`, "
        "`invalid_transition`), in the order given. Repeated ids are acted on once."
    ),
    responses=error_responses(400, 401, 403, 413, 503),
)
async def bulk_requeue(data: BulkRequeueRequest, services: Services) -> BulkResult:
    return await requeue_each(
        services, data.ids, force=data.force, clear_cancellation=data.clear_cancellation
    )


@post(
    "/cancel",
    status_code=200,
    summary="Cancel many jobs",
    description=(
        f"Up to {MAX_BULK_IDS} ids; each is cancelled as by `POST /runs/{{id}}/cancel` and "
        "answered with its own outcome (`cancelled`, `cancel_requested` for a running job, "
        "`not_found`, `conflict` for a completed or failed one), in the order given."
    ),
    responses=error_responses(400, 401, 403, 413, 503),
)
async def bulk_cancel(data: BulkCancelRequest, services: Services) -> BulkResult:
    return await cancel_each(services, data.ids)


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
