"""The runs table's query: filters, sort and page, parsed from the URL and checked.

Every value comes from the address bar, so each is checked (by the API's own checks in
``runq.api.listing``, so the console and ``GET /queue/jobs`` accept the same values) and a
bad one is a clear 400, never a database error. The sort field is one of
``SORTABLE_FIELDS`` and is never interpolated.

Paging follows ``GET /queue/jobs``: sorted by creation time (the default) the table pages
by cursor, the (created_at, id) of a page's first or last row, so runs created meanwhile
neither shift a page nor repeat one, over any number of runs. Other sorts page by number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from urllib.parse import urlencode

from runq.api.listing import checked_component, checked_text, decoded_cursor, time_bound
from runq.api.schemas import MAX_PAGE
from runq.errors import BadRequest
from runq.listing import ALL_RUNS, DEFAULT_SORT_BY, SORTABLE_FIELDS, Page, RunFilter
from runq.model import Status

PAGE_SIZES = (20, 50, 100, 200)
DEFAULT_PAGE_SIZE = 50
#: The sort under which pages follow a cursor (the store's keyset order).
KEYSET_SORT = "created_at"

#: Columns of the table, in order: (sort field or "", heading).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("", "Run"),
    ("status", "Status"),
    ("component_id", "Component"),
    ("user_id", "User"),
    ("attempt", "Attempt"),
    ("priority", "Priority"),
    ("created_at", "Created"),
    ("updated_at", "Updated"),
)


@dataclass(frozen=True)
class RunQuery:
    statuses: tuple[Status, ...] = ()
    #: Admins only: another user's runs. Non-admins are always restricted to their own.
    user: str | None = None
    component: str | None = None
    session: str | None = None
    #: Admins only, like ``user``.
    deployment: str | None = None
    #: Creation-time bounds as the form's date-time inputs show them (UTC, no zone).
    created_after: str | None = None
    created_before: str | None = None
    sort_by: str = DEFAULT_SORT_BY
    sort_order: str = "desc"
    page: int = 1
    limit: int = DEFAULT_PAGE_SIZE
    #: Keyset paging (``KEYSET_SORT`` only): the rows after this cursor in the table's
    #: order (``cursor``) or the rows just before it (``before``).
    cursor: str | None = None
    before: str | None = None
    #: What the store is asked for: the filters above, checked, plus the owner rule.
    where: RunFilter = field(default=ALL_RUNS, compare=False)

    @property
    def keyset(self) -> bool:
        return self.sort_by == KEYSET_SORT

    def params(self, **changes: object) -> str:
        """This query as a query string, with ``changes`` (page, sort ...) applied."""
        query = replace(self, **changes)  # type: ignore[arg-type]
        pairs: list[tuple[str, str]] = [("status", s.value) for s in query.statuses]
        for name in (
            "user",
            "component",
            "session",
            "deployment",
            "created_after",
            "created_before",
        ):
            value = getattr(query, name)
            if value:
                pairs.append((name, value))
        if query.sort_by != DEFAULT_SORT_BY:
            pairs.append(("sort", query.sort_by))
        if query.sort_order != "desc":
            pairs.append(("order", query.sort_order))
        if query.limit != DEFAULT_PAGE_SIZE:
            pairs.append(("limit", str(query.limit)))
        if query.page != 1:
            pairs.append(("page", str(query.page)))
        if query.cursor:
            pairs.append(("cursor", query.cursor))
        if query.before:
            pairs.append(("before", query.before))
        return urlencode(pairs)

    def sort_link(self, column: str) -> str:
        """Sorting by ``column``: descending first, a second click flips the order."""
        order = "asc" if self.sort_by == column and self.sort_order == "desc" else "desc"
        return self.params(sort_by=column, sort_order=order, page=1, cursor=None, before=None)

    def aria_sort(self, column: str) -> str:
        if column != self.sort_by:
            return "none"
        return "ascending" if self.sort_order == "asc" else "descending"


def _one(params: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = params.get(name) or []
    if len(values) > 1:
        raise BadRequest(f"{name} may be given once")
    return values[0] if values else None


def _int(params: Mapping[str, Sequence[str]], name: str, default: int, high: int) -> int:
    text = _one(params, name)
    if text is None or text == "":
        return default
    if not text.isdigit() or not 1 <= int(text) <= high:
        raise BadRequest(f"{name} must be a whole number from 1 to {high}")
    return int(text)


def _text(params: Mapping[str, Sequence[str]], name: str) -> str | None:
    """A text filter: empty means none; otherwise as the API checks it."""
    text = _one(params, name)
    if text is None or not text.strip():
        return None
    return checked_text(name, text.strip())


def _statuses(values: Sequence[str]) -> tuple[Status, ...]:
    known = {s.value: s for s in Status}
    chosen: list[Status] = []
    for value in values:
        if value not in known:
            raise BadRequest(f"status must be one of {', '.join(known)}")
        if known[value] not in chosen:
            chosen.append(known[value])
    return tuple(chosen)


def _time(params: Mapping[str, Sequence[str]], name: str) -> tuple[str | None, float | None]:
    """A creation-time bound: the form's ``YYYY-MM-DDTHH:MM[:SS]`` (UTC), any ISO 8601 time
    or epoch seconds; shown again as the date-time input's UTC value."""
    text = _text(params, name)
    seconds = time_bound(name, text)
    if seconds is None:
        return None, None
    try:
        at = datetime.fromtimestamp(seconds, UTC)
    except (OverflowError, OSError, ValueError) as e:
        raise BadRequest(f"{name} is out of range") from e
    shown = at.strftime("%Y-%m-%dT%H:%M:%S.%f" if at.microsecond else "%Y-%m-%dT%H:%M:%S")
    return shown, seconds


def _paging(params: Mapping[str, Sequence[str]], sort_by: str, page: int) -> dict[str, str]:
    """``cursor`` or ``before``, checked: one of them, only with the keyset sort, page 1."""
    found = {name: text for name in ("cursor", "before") if (text := _one(params, name))}
    if not found:
        return {}
    if len(found) > 1:
        raise BadRequest("give cursor or before, not both")
    if sort_by != KEYSET_SORT or page != 1:
        raise BadRequest(
            "cursor paging works only sorted by created_at and without page "
            "(other sorts page by number)"
        )
    for text in found.values():
        decoded_cursor(text)  # raises BadRequest for anything this server did not give out
    return found


def parse_query(
    params: Mapping[str, Sequence[str]], *, admin: bool, owner: str | None = None
) -> RunQuery:
    """The checked query; raises ``BadRequest`` naming the first bad parameter. ``owner``
    (a non-admin's user id) restricts the table to that user's own runs, as ``GET /runs``."""
    sort_by = _one(params, "sort") or DEFAULT_SORT_BY
    if sort_by not in SORTABLE_FIELDS:
        raise BadRequest(f"sort must be one of {', '.join(sorted(SORTABLE_FIELDS))}")
    order = _one(params, "order") or "desc"
    if order not in ("asc", "desc"):
        raise BadRequest("order must be asc or desc")
    page = _int(params, "page", 1, MAX_PAGE)
    statuses = _statuses(params.get("status") or [])
    user = _text(params, "user") if admin else None
    deployment = _text(params, "deployment") if admin else None
    component = _text(params, "component")
    session = _text(params, "session")
    after_text, after = _time(params, "created_after")
    before_text, before = _time(params, "created_before")
    where = RunFilter(
        statuses=statuses,
        component=checked_component(component),
        session_id=session,
        user_id=user,
        deployment_id=deployment,
        created_after=after,
        created_before=before,
        owner=owner,
    )
    paging = _paging(params, sort_by, page)
    return RunQuery(
        statuses=statuses,
        user=user,
        component=component,
        session=session,
        deployment=deployment,
        created_after=after_text,
        created_before=before_text,
        sort_by=sort_by,
        sort_order=order,
        page=page,
        limit=_int(params, "limit", DEFAULT_PAGE_SIZE, max(PAGE_SIZES)),
        cursor=paging.get("cursor"),
        before=paging.get("before"),
        where=where,
    )


@dataclass(frozen=True)
class PageLinks:
    first: str | None
    previous: str | None
    next: str | None
    last: str | None


@dataclass(frozen=True)
class RunsView:
    """One page of the table: its rows in the table's order, the count of every run the
    filters match, and (keyset paging) the cursors of the pages either side."""

    page: Page
    #: Cursor of the page before this one / after it; None when there is none.
    previous_cursor: str | None = None
    next_cursor: str | None = None


def page_links(query: RunQuery, view: RunsView, base: str) -> PageLinks:
    def at(**changes: object) -> str:
        qs = query.params(**changes)
        return f"{base}?{qs}" if qs else base

    if query.keyset:
        paged = bool(query.cursor or query.before)
        return PageLinks(
            first=at(cursor=None, before=None, page=1) if paged else None,
            previous=at(cursor=None, before=view.previous_cursor) if view.previous_cursor else None,
            next=at(before=None, cursor=view.next_cursor) if view.next_cursor else None,
            last=None,
        )
    total_pages = min(view.page.total_pages, MAX_PAGE)
    return PageLinks(
        first=at(page=1) if query.page > 1 else None,
        previous=at(page=min(query.page - 1, max(total_pages, 1))) if query.page > 1 else None,
        next=at(page=query.page + 1) if query.page < total_pages else None,
        last=at(page=total_pages) if query.page < total_pages else None,
    )
