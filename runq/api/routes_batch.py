"""``POST /runs/batch``: submit up to ``MAX_BATCH_RUNS`` runs in one request, all or none.

Each item is checked as ``POST /runs`` checks its body (the same schema, priority bounds,
component and timeout checks, and the ``Idempotency-Key`` rules for the item's
``idempotency_key`` field) before anything is stored; a refusal names the first bad item by
its index (``items[517].component_type: ...``). The runs are then stored in one
transaction by ``Queue.defer_many`` with one wake-up; every item answers ``run_id``,
``status`` and ``created`` (false when an idempotency or unique key answered with an
existing run), in the order given.
"""

from __future__ import annotations

from litestar import Response, Router, post

from runq.api.guards import CurrentIdentity, Services, authenticate
from runq.api.problems import error_responses
from runq.api.routes_runs import checked_key_text, new_run_of, submit_response
from runq.api.schemas import MAX_BATCH_RUNS, BatchAccepted, BatchItem, BatchSubmission
from runq.errors import RunqError, UnknownComponent
from runq.model import NewRun


@post(
    "/",
    status_code=202,
    summary="Submit runs in one batch",
    description=(
        f"Stores up to {MAX_BATCH_RUNS} queued runs in one transaction, all or none, and "
        "answers 202 with one `{run_id, status, created}` per item, in order. Each item "
        "takes the fields of `POST /runs` (without `background`) plus `idempotency_key`. "
        "400 names the first bad item (`items[517].component_type: ...`); 429 when the "
        "batch does not fit the queue's depth limits. Nothing is stored on any error."
    ),
    responses=error_responses(400, 401, 403, 409, 413, 422, 429, 503),
)
async def submit_batch(
    data: BatchSubmission, services: Services, identity: CurrentIdentity
) -> Response[BatchAccepted]:
    news = [_checked_item(i, item, services, identity) for i, item in enumerate(data.items)]
    results = await services.queue.defer_many(news)
    accepted = [
        submit_response(
            result,
            None,
            inline=False,
            own=result.created or result.run.user_id == identity.actor.user_id,
        ).content
        for result in results
    ]
    return Response(BatchAccepted(items=accepted), status_code=202)


def _checked_item(
    index: int, item: BatchItem, services: Services, identity: CurrentIdentity
) -> NewRun:
    """The item as ``POST /runs`` would build it; a refusal is re-raised as the same error
    with the item's index in front, so the caller knows which line to fix."""
    try:
        if not services.queue.components.knows(item.component_type, item.component_id):
            raise UnknownComponent(
                f"no component {item.component_type}/{item.component_id} is configured"
            )
        key = item.idempotency_key
        if key is not None:
            key = checked_key_text(key, "idempotency_key")
        return new_run_of(item, identity, key, services)
    except RunqError as e:
        raise type(e)(f"items[{index}]: {e}") from e


def batch_router(*, secured: bool) -> Router:
    return Router(
        path="/runs/batch",
        route_handlers=[submit_batch],
        guards=[authenticate],
        tags=["runs"],
        security=[{"bearer": []}] if secured else None,
    )
