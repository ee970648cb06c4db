"""The runs table: ``/ui/runs`` (a user's own runs) and ``/ui/queue/jobs`` (every run,
admin), each with its live stream.

Filters and paging are ``listing``'s; this module reads the page they name and draws it.
A non-admin's table is always their own runs, by the store's owner rule (the one
``GET /runs`` applies: their user id, and not a service account's run), whatever the URL
says.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import msgspec
from litestar import Response, get
from litestar.response import Redirect, ServerSentEvent

from runq.api.auth import Forbidden
from runq.api.guards import services_of
from runq.api.routes_bulk import MAX_BULK_IDS
from runq.listing import Page, RunCursor
from runq.model import Status
from runq.ops.operations import Operations
from runq.ui.listing import COLUMNS, PAGE_SIZES, RunQuery, RunsView, page_links, parse_query
from runq.ui.live_runs import page_version, rows_stream
from runq.ui.pages import console_state, flash_of
from runq.ui.render import fragment, render
from runq.ui.session import AnyRequest, identity_of, ui_authenticate

MY_RUNS = "/ui/runs"
ALL_RUNS_BASE = "/ui/queue/jobs"


def _query(request: AnyRequest, *, admin_view: bool) -> RunQuery:
    """The checked query of ``/ui/runs`` (own runs) or ``/ui/queue/jobs`` (admin)."""
    params = {key: request.query_params.getall(key) for key in request.query_params}
    owner = None if admin_view else identity_of(request).user_id
    return parse_query(params, admin=admin_view, owner=owner)


def _cursor_of(page: Page, index: int) -> str | None:
    return RunCursor.of(page.data[index]).encode() if page.data else None


async def read_view(ops: Operations, query: RunQuery) -> RunsView:
    """The page the query names. Keyset paging reads forward from ``cursor``, or backward
    from ``before`` (the opposite order from that cursor, the rows then put back in the
    table's order): each is one indexed read, whatever the page's depth."""
    backward = query.before is not None
    anchor = query.before or query.cursor
    order = query.sort_order
    if backward:
        order = "asc" if order == "desc" else "desc"
    page = await ops.list_jobs(
        where=query.where,
        page=query.page,
        limit=query.limit,
        sort_by=query.sort_by,
        sort_order=order,
        after=RunCursor.decode(anchor) if anchor else None,
    )
    if not query.keyset:
        return RunsView(page=page)
    if backward:
        page = msgspec.structs.replace(page, data=page.data[::-1])
        more_before = page.next_cursor is not None
        return RunsView(
            page=page,
            previous_cursor=_cursor_of(page, 0) if more_before else None,
            # The anchor row itself follows this page (unless it was deleted meanwhile).
            next_cursor=_cursor_of(page, -1),
        )
    return RunsView(
        page=page,
        previous_cursor=_cursor_of(page, 0) if query.cursor else None,
        next_cursor=page.next_cursor,
    )


def _live_rows_url(base: str, query: RunQuery, page: Page) -> str:
    qs = query.params()
    return f"{base}/live?{qs + '&' if qs else ''}{urlencode({'v': page_version(page)})}"


async def _render_runs(
    request: AnyRequest, query: RunQuery, *, base: str, admin_view: bool
) -> Response[str]:
    view = await read_view(services_of(request).ops, query)
    return render(
        request,
        "runs.html",
        identity=identity_of(request),
        title="All runs" if admin_view else "My runs",
        base=base,
        admin_view=admin_view,
        query=query,
        page=view.page,
        links=page_links(query, view, base),
        columns=COLUMNS,
        statuses=[s.value for s in Status],
        page_sizes=PAGE_SIZES,
        max_bulk=MAX_BULK_IDS,
        flash=flash_of(request),
        live_rows=_live_rows_url(base, query, view.page),
    )


def _runs_live(request: AnyRequest, query: RunQuery, *, admin_view: bool) -> ServerSentEvent:
    """The table's stream: its query's rows, through the shared cache, when they change.
    The view's key is its whole query string and its owner, so two users never share."""
    state = console_state(request)
    ops = services_of(request).ops
    key = (query.params(), query.where.owner)

    async def read_page() -> Page:
        return (await read_view(ops, query)).page

    async def read() -> Page:
        return await state.listings.get(key, read_page)

    def draw(page: Page) -> dict[str, str]:
        return {
            "rows": fragment("_run_rows.html", "rows", page, admin_view, COLUMNS),
            "count": fragment("_run_rows.html", "count", page, query),
        }

    shown = request.query_params.get("v") or ""
    return ServerSentEvent(
        rows_stream(read, draw, state.hint, shown=shown[:64]),
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


def _owns_runs(request: AnyRequest) -> None:
    if identity_of(request).user_id is None:
        raise Forbidden("this identity has no user id, so it owns no runs")


@get("/runs", guards=[ui_authenticate])
async def my_runs(request: AnyRequest) -> Response[Any]:
    identity = identity_of(request)
    if identity.user_id is None and identity.is_admin:
        # Key holders and open mode have no user of their own: their list is every run.
        qs = request.url.query
        return Redirect(f"{ALL_RUNS_BASE}{'?' + qs if qs else ''}", status_code=303)
    _owns_runs(request)
    query = _query(request, admin_view=False)
    return await _render_runs(request, query, base=MY_RUNS, admin_view=False)


@get("/runs/live", guards=[ui_authenticate])
async def my_runs_live(request: AnyRequest) -> ServerSentEvent:
    _owns_runs(request)
    return _runs_live(request, _query(request, admin_view=False), admin_view=False)


@get("/jobs")
async def all_runs(request: AnyRequest) -> Response[str]:
    query = _query(request, admin_view=True)
    return await _render_runs(request, query, base=ALL_RUNS_BASE, admin_view=True)


@get("/jobs/live")
async def all_runs_live(request: AnyRequest) -> ServerSentEvent:
    return _runs_live(request, _query(request, admin_view=True), admin_view=True)
