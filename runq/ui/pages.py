"""The console's pages and forms.

``/ui/runs`` and ``/ui/runs/{id}`` are for every signed-in user, with the API's visibility:
a user lists only their own runs and opens only what ``GET /runs/{id}`` would show them.
``/ui/queue/...`` is the operator surface and needs the admin scope, like ``/queue``.
Every POST checks the CSRF token first and answers with a redirect (post/redirect/get),
so reloading a page never repeats an action.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from litestar import Response, get, post
from litestar.datastructures import FormMultiDict
from litestar.response import Redirect, ServerSentEvent

from runq.api import ApiServices
from runq.api.auth import Forbidden, Identity
from runq.api.guards import services_of
from runq.api.routes_bulk import MAX_BULK_IDS, cancel_each, requeue_each
from runq.api.routes_events import event_seq, for_viewer
from runq.api.schemas import is_plausible_id
from runq.errors import BadRequest, NotFound, RunqError
from runq.model import FINAL_EVENT_KINDS, FINAL_STATUSES, Run, RunEvent, Status
from runq.ui.chart import MINUTES, ThroughputCache
from runq.ui.errors import status_of
from runq.ui.live import stats_stream
from runq.ui.live_runs import ConsoleState, timeline_stream
from runq.ui.overview import Overview, overview_from_metrics
from runq.ui.render import partial, render
from runq.ui.session import (
    AnyRequest,
    check_csrf,
    check_signin_csrf,
    cleared_session_cookie,
    identity_of,
    new_signin_cookie,
    session_cookie,
    ui_authenticate,
    verify_credential,
)

HTML = Response[str]

#: What a redirect after an action may say; the URL carries the key, never free text.
FLASH_MESSAGES: dict[str, str] = {
    "requeued": "The run was requeued.",
    "cancelled": "The run was cancelled.",
    "cancel_requested": "Cancel recorded: the run stops at its next checkpoint or heartbeat.",
    "continued": "The run was continued with your decision.",
    "signed_out": "You are signed out.",
}
#: A run page lists this many live statuses as "can be cancelled".
CANCELLABLE = frozenset({Status.QUEUED, Status.PAUSED, Status.RUNNING})
REQUEUEABLE = frozenset({Status.FAILED, Status.CANCELLED})
#: Longest decision the editor accepts, in characters (the body limit applies as well).
MAX_DECISION_CHARS = 256 * 1024
#: A run page shows at most this many stored events (a stream is for progress, and a run
#: with more has its full log at ``GET /runs/{id}/events``).
MAX_TIMELINE_EVENTS = 1000
#: Where the console keeps its per-app state (caches, the change hint) in ``app.state``.
CONSOLE_STATE_KEY = "runq_console"


async def _form(request: AnyRequest) -> FormMultiDict:
    return await request.form()


def flash_of(request: AnyRequest) -> str | None:
    return FLASH_MESSAGES.get(request.query_params.get("done") or "")


def _safe_next(target: str | None) -> str:
    """Only a console path: never another site (``//host``) or a scheme."""
    if target and target.startswith("/ui") and not target.startswith("//") and "\\" not in target:
        return target
    return "/ui"


async def read_overview(services: ApiServices) -> Overview:
    return overview_from_metrics((await services.render_metrics()).decode())


def console_state(request: AnyRequest) -> ConsoleState:
    """Made on first use, then shared by every request and stream of the app."""
    state = request.app.state
    found = state.get(CONSOLE_STATE_KEY)
    if isinstance(found, ConsoleState):
        return found
    ops = services_of(request).ops

    async def read_throughput() -> tuple[float, list[tuple[float, str, int]]]:
        return await ops.finished_per_minute(window_seconds=MINUTES * 60.0)

    made = ConsoleState(throughput=ThroughputCache(read_throughput))
    made.attach(ops.notifications())
    state[CONSOLE_STATE_KEY] = made
    return made


# -- sign in / out ----------------------------------------------------------------------------


@get("/signin", name="ui_signin")
async def signin_form(request: AnyRequest) -> Response[Any]:
    if services_of(request).config.http.auth == "open":
        return Redirect("/ui", status_code=303)
    return _signin_page(request, next_path=request.query_params.get("next"))


def _signin_page(
    request: AnyRequest, *, next_path: str | None, problem: str | None = None, status: int = 200
) -> HTML:
    cookie = new_signin_cookie(request)
    response = render(
        request,
        "signin.html",
        status_code=status,
        title="Sign in",
        next_path=_safe_next(next_path),
        signin_token=cookie.value,
        mode=services_of(request).config.http.auth,
        problem=problem,
        flash=flash_of(request),
    )
    response.set_cookie(cookie)
    return response


@post("/signin", status_code=303)
async def signin(request: AnyRequest) -> Response[Any]:
    form = await _form(request)
    check_signin_csrf(request, form.get("signin_token"))
    credential = str(form.get("credential") or "").strip()
    next_path = _safe_next(form.get("next"))
    try:
        verify_credential(request, credential)
    except RunqError as e:
        return _signin_page(request, next_path=next_path, problem=str(e), status=401)
    response: Redirect = Redirect(next_path, status_code=303)
    response.set_cookie(session_cookie(request, credential))
    response.delete_cookie("runq_signin", path="/ui")
    return response


@post("/signout", status_code=303, guards=[ui_authenticate])
async def signout(request: AnyRequest) -> Response[Any]:
    form = await _form(request)
    check_csrf(request, form.get("csrf"))
    response: Redirect = Redirect("/ui/signin?done=signed_out", status_code=303)
    response.set_cookie(cleared_session_cookie(request))
    return response


# -- home, runs --------------------------------------------------------------------------------


@get("/", guards=[ui_authenticate])
async def home(request: AnyRequest) -> Redirect:
    return Redirect("/ui/queue" if identity_of(request).is_admin else "/ui/runs", status_code=303)


# -- one run -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunActions:
    cancel: bool
    continue_: bool
    requeue: bool


def _actions(identity: Identity, run: Run) -> RunActions:
    return RunActions(
        cancel=run.status in CANCELLABLE and identity.can_cancel(run),
        continue_=run.status is Status.PAUSED and identity.can_continue(run),
        requeue=run.status in REQUEUEABLE and identity.is_admin,
    )


async def _visible_run(request: AnyRequest, run_id: str) -> Run:
    """As ``GET /runs/{id}``: a run the caller may not see does not exist for them."""
    run = await services_of(request).ops.get(run_id) if is_plausible_id(run_id) else None
    if run is None or not identity_of(request).can_see(run):
        raise NotFound("no such run, or not one you may see")
    return run


async def _timeline(request: AnyRequest, run: Run) -> tuple[list[RunEvent], bool, str | None]:
    """The stored events as the viewer may see them, whether some were left out, and the
    live stream's URL (None once the log holds the final event: nothing will follow)."""
    content = identity_of(request).can_read_content(run)
    stored = await services_of(request).ops.list_events(
        run.id, after=0, limit=MAX_TIMELINE_EVENTS + 1
    )
    truncated = len(stored) > MAX_TIMELINE_EVENTS
    events = [for_viewer(e, content) for e in stored[:MAX_TIMELINE_EVENTS]]
    ended = any(e.kind in FINAL_EVENT_KINDS for e in events) or (
        run.status in FINAL_STATUSES and not events
    )
    if ended or truncated:
        return events, truncated, None
    after = events[-1].seq if events else 0
    return events, truncated, f"/ui/runs/{run.id}/events?{urlencode({'after': after})}"


async def _run_page(
    request: AnyRequest,
    run: Run,
    *,
    status_code: int = 200,
    problem: str | None = None,
    decision_text: str = "",
) -> HTML:
    identity = identity_of(request)
    events, truncated, live_events = await _timeline(request, run)
    # The handler's whole message, opened from its sealed column: admins only, as on
    # GET /queue/jobs/{id}; ``error`` above it is what the privacy level lets anyone see.
    error_detail = (
        await services_of(request).ops.error_detail(run.id) if identity.is_admin else None
    )
    return render(
        request,
        "run.html",
        status_code=status_code,
        identity=identity,
        title=f"Run {run.id}",
        run=run,
        error_detail=error_detail if error_detail != run.error else None,
        content=identity.can_read_content(run),
        actions=_actions(identity, run),
        problem=problem,
        decision_text=decision_text,
        flash=flash_of(request),
        events=events,
        timeline_truncated=truncated,
        live_events=live_events,
    )


@get("/runs/{run_id:str}", guards=[ui_authenticate])
async def run_page(request: AnyRequest, run_id: str) -> HTML:
    return await _run_page(request, await _visible_run(request, run_id))


def _resume_after(request: AnyRequest) -> int:
    """``Last-Event-ID`` (a reconnecting browser) wins over ``?after``."""
    text = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    return event_seq(text, "after")


@get("/runs/{run_id:str}/events", guards=[ui_authenticate])
async def run_events_live(request: AnyRequest, run_id: str) -> ServerSentEvent:
    """The run page's timeline stream: ``GET /runs/{id}/events`` for the session cookie."""
    run = await _visible_run(request, run_id)
    content = identity_of(request).can_read_content(run)
    return ServerSentEvent(
        timeline_stream(
            services_of(request).queue.follow,
            run,
            after=_resume_after(request),
            viewer=lambda event: for_viewer(event, content),
        ),
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def _back_to_run(run_id: str, done: str) -> Redirect:
    return Redirect(f"/ui/runs/{run_id}?{urlencode({'done': done})}", status_code=303)


async def _refused(request: AnyRequest, run_id: str, error: RunqError, decision: str = "") -> HTML:
    """The run page again, saying why the action was refused, with the API's status code."""
    run = await _visible_run(request, run_id)
    return await _run_page(
        request, run, status_code=status_of(error), problem=str(error), decision_text=decision
    )


@post("/runs/{run_id:str}/cancel", guards=[ui_authenticate], status_code=303)
async def cancel_action(request: AnyRequest, run_id: str) -> Response[Any]:
    check_csrf(request, (await _form(request)).get("csrf"))
    run = await _visible_run(request, run_id)
    if not identity_of(request).can_cancel(run):
        raise Forbidden("only the run's own user or an admin may cancel it")
    try:
        cancelled = await services_of(request).queue.cancel(run.id)
    except RunqError as e:
        if status_of(e) >= 500:
            raise
        return await _refused(request, run.id, e)
    done = "cancel_requested" if cancelled.status is Status.RUNNING else "cancelled"
    return _back_to_run(run.id, done)


def parse_decision(text: str) -> Any:
    """The editor's JSON; an empty editor is ``null`` (a bare approval)."""
    if len(text) > MAX_DECISION_CHARS:
        raise BadRequest(f"the decision is longer than {MAX_DECISION_CHARS} characters")
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRequest(f"the decision is not valid JSON: {e.msg} (line {e.lineno})") from e


@post("/runs/{run_id:str}/continue", guards=[ui_authenticate], status_code=303)
async def continue_action(request: AnyRequest, run_id: str) -> Response[Any]:
    form = await _form(request)
    check_csrf(request, form.get("csrf"))
    run = await _visible_run(request, run_id)
    if not identity_of(request).can_continue(run):
        raise Forbidden("only the run's own user, an approver or an admin may continue it")
    text = str(form.get("decision") or "")
    services = services_of(request)
    try:
        await services.queue.continue_(run.id, parse_decision(text))
    except RunqError as e:
        if status_of(e) >= 500:
            raise
        return await _refused(request, run.id, e, decision=text)
    services.wake()
    return _back_to_run(run.id, "continued")


# -- the operator surface (admin) --------------------------------------------------------------


@get("/")
async def overview_page(request: AnyRequest) -> HTML:
    overview = await read_overview(services_of(request))
    return render(
        request,
        "overview.html",
        identity=identity_of(request),
        title="Overview",
        overview=overview,
        throughput=await console_state(request).throughput.get(),
        statuses=[s.value for s in Status],
        live="/ui/queue/live",
    )


@get("/live")
async def overview_live(request: AnyRequest) -> ServerSentEvent:
    services = services_of(request)
    throughput = console_state(request).throughput

    async def chart() -> dict[str, str]:
        return {"throughput": partial("_chart.html", throughput=await throughput.get())}

    return ServerSentEvent(
        stats_stream(lambda: read_overview(services), fragments=chart),
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


@post("/jobs/{run_id:str}/requeue", status_code=303)
async def requeue_action(request: AnyRequest, run_id: str) -> Response[Any]:
    form = await _form(request)
    check_csrf(request, form.get("csrf"))
    run = await _visible_run(request, run_id)
    services = services_of(request)
    try:
        await services.queue.requeue(
            run.id,
            force=form.get("force") == "on",
            clear_cancellation=form.get("clear_cancellation") == "on",
        )
    except RunqError as e:
        if status_of(e) >= 500:
            raise
        return await _refused(request, run.id, e)
    services.wake()
    return _back_to_run(run.id, "requeued")


@post("/jobs/bulk", status_code=200)
async def bulk_action(request: AnyRequest) -> HTML:
    form = await _form(request)
    check_csrf(request, form.get("csrf"))
    ids = [str(value) for value in form.getall("ids")] if "ids" in form else []
    if not ids:
        raise BadRequest("select at least one run")
    if len(ids) > MAX_BULK_IDS:
        raise BadRequest(f"at most {MAX_BULK_IDS} runs at once")
    action = form.get("action")
    services = services_of(request)
    if action == "requeue":
        result = await requeue_each(
            services,
            ids,
            force=form.get("force") == "on",
            clear_cancellation=form.get("clear_cancellation") == "on",
        )
    elif action == "cancel":
        result = await cancel_each(services, ids)
    else:
        raise BadRequest("action must be requeue or cancel")
    return render(
        request,
        "bulk.html",
        identity=identity_of(request),
        title=f"Bulk {action}",
        action=action,
        result=result,
        back=_safe_next(form.get("back")),
    )


@get("/workers")
async def workers_page(request: AnyRequest) -> HTML:
    services = services_of(request)
    ops = services.ops
    queue_config = services.config.queue
    live_within = queue_config.live_worker_seconds
    # Workers not seen for a day are pruned anyway; show the missing ones up to then.
    workers = await ops.workers(max_age_seconds=86400.0)
    running = await ops.running_by_worker()
    now = await ops.now()
    listed = {w.id for w in workers}
    return render(
        request,
        "workers.html",
        identity=identity_of(request),
        title="Workers",
        workers=workers,
        running=running,
        orphaned=sum(n for worker, n in running.items() if worker not in listed),
        now=now,
        live_within=live_within,
        heartbeat_interval=queue_config.heartbeat_interval,
    )
