"""``/runs``: submit, read, cancel and continue runs, with per-caller visibility.

Visibility: admins see and open every run; holders of the approve scope see every run and
may continue it (a decision needs no content) but get no payload or answer; everyone else
sees only their own runs and gets 404 for the rest, so the existence of another user's
run is not disclosed. ``GET /runs`` lists by the same rule, filtered in SQL: a user's
listing holds only their own runs (never a service account's), and an approver's items
carry no payload or answer unless the run is the approver's own.
"""

from __future__ import annotations

import contextlib
from typing import Annotated

from litestar import Response, Router, get, post
from litestar.openapi.datastructures import ResponseSpec
from litestar.params import Parameter

from runq.api import ApiServices
from runq.api.auth import Forbidden, Identity
from runq.api.guards import CurrentIdentity, Services, authenticate, visible_run
from runq.api.listing import decoded_cursor, run_filter
from runq.api.listing_params import (
    ComponentFilter,
    Cursor,
    Limit,
    StatusFilter,
    TextFilter,
    TimeBound,
)
from runq.api.problems import IdempotencyKeyInvalid, error_responses
from runq.api.schemas import (
    MAX_IDEMPOTENCY_KEY_CHARS,
    ContinueRequest,
    RunOptions,
    RunOut,
    RunsPage,
    RunSubmission,
    SubmitAccepted,
)
from runq.errors import BadRequest, NotFound, UnknownComponent
from runq.follow import MAX_WAIT_SECONDS
from runq.model import NewRun, Run, SubmitResult
from runq.ops.views import OWNER_CONTENT_VIEW, OWNER_VIEW, RunView

RunId = Annotated[str, Parameter(description="The run id (equal to its job id).")]
IdempotencyKey = Annotated[
    str | None,
    Parameter(
        header="Idempotency-Key",
        required=False,
        description=(
            "Makes the submission safe to retry: the same key from the same user answers "
            f"with the original run. At most {MAX_IDEMPOTENCY_KEY_CHARS} characters (else 422) "
            "of UTF-8 text without control or invisible characters (else 400); reused for "
            "another component: 409."
        ),
    ),
]


@post(
    "/",
    status_code=202,
    summary="Submit a run",
    description=(
        "Stores a queued run and answers 202. With `background: false` the routing rule "
        "applies: on a `sync` route the run executes inside the request and the answer "
        "comes back with 200."
    ),
    responses={
        200: ResponseSpec(
            data_container=SubmitAccepted, description="Executed inside the request (sync route)"
        ),
        **error_responses(400, 401, 403, 409, 413, 422, 429, 503),
    },
)
async def submit_run(
    data: RunSubmission,
    services: Services,
    identity: CurrentIdentity,
    idempotency_key: IdempotencyKey = None,
) -> Response[SubmitAccepted]:
    key = _checked_idempotency_key(idempotency_key)
    queue = services.queue
    if not queue.components.knows(data.component_type, data.component_id):
        raise UnknownComponent(
            f"no component {data.component_type}/{data.component_id} is configured"
        )
    new = new_run_of(data, identity, key, services)
    result, executed = await queue.submit(new, background=data.background)
    inline = not data.background and queue.route(data.component_type, data.component_id) == "sync"
    own = result.created or result.run.user_id == identity.actor.user_id
    return submit_response(result, executed, inline=inline, own=own)


def _checked_idempotency_key(raw: str | None) -> str | None:
    if raw is None:
        return None
    return checked_key_text(_header_text(raw, "Idempotency-Key"), "Idempotency-Key")


def checked_key_text(key: str, name: str) -> str:
    """An idempotency key as stored: bounded, not blank, printable (``name`` in refusals)."""
    if len(key) > MAX_IDEMPOTENCY_KEY_CHARS:
        raise IdempotencyKeyInvalid(
            f"{name} is {len(key)} characters; at most {MAX_IDEMPOTENCY_KEY_CHARS} are allowed"
        )
    if not key.strip():
        raise BadRequest(f"{name} must not be empty")
    # The key is stored and shown by `runq jobs`: an escape sequence in it would reach the
    # operator's terminal, and invisible characters would make two keys look alike.
    if not key.isprintable():
        raise BadRequest(f"{name} must not contain control or invisible characters")
    return key


def _header_text(raw: str, name: str) -> str:
    """A header value as the client's UTF-8 text (ASGI servers hand it over as Latin-1)."""
    try:
        return raw.encode("latin-1").decode("utf-8")
    except UnicodeError as e:
        raise BadRequest(f"{name} must be UTF-8 text") from e


def _checked_priority(requested: int | None, identity: Identity, services: ApiServices) -> int:
    """Admins may ask for any priority; other callers only for ``[http] user_priority_range``
    (lower runs first, so an unbounded priority would put one user ahead of everyone)."""
    if identity.is_admin:
        return 0 if requested is None else requested
    low, high = services.config.http.user_priority_range
    if requested is None:
        return min(max(0, low), high)
    if not low <= requested <= high:
        raise BadRequest(
            f"priority {requested} is outside {low}..{high} ([http] user_priority_range); "
            "only an admin may set another"
        )
    return requested


def new_run_of(
    data: RunOptions, identity: Identity, key: str | None, services: ApiServices
) -> NewRun:
    """The queue resolves the defaults (``max_attempts``, this replica's deployment)."""
    new = services.queue.new_run(
        data.component_type,
        data.component_id,
        data.payload,
        session_id=data.session_id,
        actor=identity.actor,
        configuration=data.configuration,
        idempotency_key=key,
        max_attempts=data.max_attempts,
        deployment_id=data.deployment_id or None,
        priority=_checked_priority(data.priority, identity, services),
        delay_seconds=data.delay_seconds,
        origin="http",
        unique_key=data.unique_key,
        unique_for_seconds=data.unique_for_seconds,
        unique_states=data.unique_states,
        concurrency_key=data.concurrency_key,
        timeout_seconds=data.timeout_seconds,
    )
    if data.deployment_id == "":
        # An explicit "" means "no deployment" (any worker), as in the config key; only an
        # absent field takes the accepting replica's deployment.
        new.deployment_id = None
    return new


def submit_response(
    result: SubmitResult, executed: Run | None, *, inline: bool, own: bool = True
) -> Response[SubmitAccepted]:
    """``own``: the run is the submitter's; a unique key may answer another user's run,
    whose session and outcome are then not shown."""
    run = executed if executed is not None else result.run
    body = SubmitAccepted(
        run_id=run.id,
        session_id=run.session_id if own else None,
        status=run.status,
        created=result.created,
    )
    headers = {"Location": f"/runs/{run.id}"}
    if not result.created:
        headers["Idempotent-Replayed"] = "true"
    if inline and run.is_final and own:
        # The submitter is the run's own user (idempotency keys are per user), so the
        # answer it kept is theirs to read.
        body.answer = run.answer
        body.error = run.error
        body.termination_reason = run.termination_reason
        return Response(body, status_code=200, headers=headers)
    return Response(body, status_code=202, headers=headers)


def _out(identity: Identity, run: Run) -> RunView:
    content = identity.can_read_content(run)
    return RunView.of(run, OWNER_CONTENT_VIEW if content else OWNER_VIEW)


@get(
    "/",
    summary="List runs",
    description=(
        "Runs the caller may see, newest first (created_at, then id), filtered by `status` "
        "(repeatable), `component`, `session_id`, `created_after` (inclusive) and "
        "`created_before` (exclusive). Admins and approvers list every run; anyone else "
        "their own runs. `next_cursor` continues the listing; runs created meanwhile do not "
        "shift later pages."
    ),
    responses=error_responses(400, 401, 503),
)
async def list_runs(
    services: Services,
    identity: CurrentIdentity,
    status: StatusFilter = None,
    component: ComponentFilter = None,
    session_id: TextFilter = None,
    created_after: TimeBound = None,
    created_before: TimeBound = None,
    cursor: Cursor = None,
    limit: Limit = 50,
) -> RunsPage:
    sees_all = identity.is_admin or identity.is_approver
    where = run_filter(
        status=status,
        component=component,
        session_id=session_id,
        created_after=created_after,
        created_before=created_before,
        owner=None if sees_all else identity.user_id,
    )
    after = decoded_cursor(cursor)
    if not sees_all and (identity.user_id is None or identity.service_account):
        return RunsPage(data=[], next_cursor=None)  # owns no runs (see Identity.owns)
    found = await services.ops.list_runs(where, after=after, limit=limit)
    return RunsPage(data=[_out(identity, run) for run in found.data], next_cursor=found.next_cursor)


@get(
    "/{run_id:str}",
    summary="Read a run",
    description=(
        "The job fields as the caller may see them, plus `answer` when kept. With `wait=S` "
        "(at most 60) the answer comes as soon as the run is final or paused, or after S "
        "seconds with the run as it is then."
    ),
    responses=error_responses(400, 401, 404, 503),
)
async def read_run(
    run_id: RunId,
    services: Services,
    identity: CurrentIdentity,
    wait: Annotated[float | None, Parameter(ge=0, le=MAX_WAIT_SECONDS, required=False)] = None,
) -> RunOut:
    run = await visible_run(services, identity, run_id)
    if wait:
        with contextlib.suppress(NotFound):  # gone meanwhile: answer with what was read
            run = await services.queue.wait(run.id, wait)
    out = _out(identity, run)
    out.waiting = await services.ops.why_waiting(run)
    return out


@post(
    "/{run_id:str}/cancel",
    status_code=200,
    summary="Cancel a run",
    description=(
        "Queued or paused: cancelled at once. Running: the cancel is recorded and the run "
        "stops at its next checkpoint or heartbeat. Completed or failed: 409."
    ),
    responses=error_responses(400, 401, 403, 404, 409, 503),
)
async def cancel_run(run_id: RunId, services: Services, identity: CurrentIdentity) -> RunOut:
    run = await visible_run(services, identity, run_id)
    if not identity.can_cancel(run):
        raise Forbidden("only the run's own user or an admin may cancel it")
    return _out(identity, await services.queue.cancel(run.id))


@post(
    "/{run_id:str}/continue",
    status_code=200,
    summary="Continue a paused run",
    description=(
        "Queues a paused run again with `decision` (its handler reads `ctx.resume`). "
        "409 when the run is not paused; a second continue of the same pause answers "
        "with the same run and changes nothing."
    ),
    responses=error_responses(400, 401, 403, 404, 409, 413, 503),
)
async def continue_run(
    run_id: RunId,
    services: Services,
    identity: CurrentIdentity,
    data: ContinueRequest | None = None,
) -> RunOut:
    run = await visible_run(services, identity, run_id)
    if not identity.can_continue(run):
        raise Forbidden("only the run's own user, an approver or an admin may continue it")
    decision = data.decision if data is not None else None
    continued = await services.queue.continue_(run.id, decision)
    services.wake()
    return _out(identity, continued)


def runs_router(*, secured: bool) -> Router:
    """``secured``: the OpenAPI document names the bearer scheme (auth key or jwt)."""
    return Router(
        path="/runs",
        route_handlers=[submit_run, list_runs, read_run, cancel_run, continue_run],
        guards=[authenticate],
        tags=["runs"],
        security=[{"bearer": []}] if secured else None,
    )
