"""The runs table's query: filters, sort and page, parsed from the URL and checked.

Every value comes from the address bar, so each is checked against a whitelist or a range
and a bad one is a clear 400, never a database error. The sort field is one of
``SORTABLE_FIELDS`` and is never interpolated.

The store's listing filters by status and user and pages by offset today. Filters by
component, session, deployment and creation time, and cursor paging, need a filtered
listing in the store; until it exists the form shows them disabled (``PENDING_FILTERS``)
and a request that names one is told it was not applied rather than silently shown
an unfiltered table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from urllib.parse import urlencode

from runq.api.schemas import MAX_PAGE
from runq.errors import BadRequest
from runq.model import DEFAULT_SORT_BY, SORTABLE_FIELDS, Page, Status

PAGE_SIZES = (20, 50, 100, 200)
DEFAULT_PAGE_SIZE = 50
MAX_TEXT_FILTER_CHARS = 200

#: Filters the form shows but the store cannot apply yet (query parameter → label).
PENDING_FILTERS: dict[str, str] = {
    "component": "Component",
    "session": "Session",
    "deployment": "Deployment",
    "created_after": "Created after",
    "created_before": "Created before",
}

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
    sort_by: str = DEFAULT_SORT_BY
    sort_order: str = "desc"
    page: int = 1
    limit: int = DEFAULT_PAGE_SIZE
    #: Pending filters the request named (not applied): parameter → value.
    pending: dict[str, str] = field(default_factory=dict)

    def params(self, **changes: object) -> str:
        """This query as a query string, with ``changes`` (page, sort ...) applied."""
        query = replace(self, **changes)  # type: ignore[arg-type]
        pairs: list[tuple[str, str]] = [("status", s.value) for s in query.statuses]
        if query.user:
            pairs.append(("user", query.user))
        if query.sort_by != DEFAULT_SORT_BY:
            pairs.append(("sort", query.sort_by))
        if query.sort_order != "desc":
            pairs.append(("order", query.sort_order))
        if query.limit != DEFAULT_PAGE_SIZE:
            pairs.append(("limit", str(query.limit)))
        if query.page != 1:
            pairs.append(("page", str(query.page)))
        return urlencode(pairs)

    def sort_link(self, column: str) -> str:
        """Sorting by ``column``: descending first, a second click flips the order."""
        order = "asc" if self.sort_by == column and self.sort_order == "desc" else "desc"
        return self.params(sort_by=column, sort_order=order, page=1)

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
    text = _one(params, name)
    if text is None or not text.strip():
        return None
    if len(text) > MAX_TEXT_FILTER_CHARS or not text.isprintable():
        raise BadRequest(f"{name} must be printable text of at most {MAX_TEXT_FILTER_CHARS}")
    return text.strip()


def _statuses(values: Sequence[str]) -> tuple[Status, ...]:
    known = {s.value: s for s in Status}
    chosen: list[Status] = []
    for value in values:
        if value not in known:
            raise BadRequest(f"status must be one of {', '.join(known)}")
        if known[value] not in chosen:
            chosen.append(known[value])
    return tuple(chosen)


def parse_query(params: Mapping[str, Sequence[str]], *, admin: bool) -> RunQuery:
    """The checked query; raises ``BadRequest`` naming the first bad parameter."""
    sort_by = _one(params, "sort") or DEFAULT_SORT_BY
    if sort_by not in SORTABLE_FIELDS:
        raise BadRequest(f"sort must be one of {', '.join(sorted(SORTABLE_FIELDS))}")
    order = _one(params, "order") or "desc"
    if order not in ("asc", "desc"):
        raise BadRequest("order must be asc or desc")
    limit = _int(params, "limit", DEFAULT_PAGE_SIZE, max(PAGE_SIZES))
    pending = {name: value for name in PENDING_FILTERS if (value := _text(params, name))}
    return RunQuery(
        statuses=_statuses(params.get("status") or []),
        user=_text(params, "user") if admin else None,
        sort_by=sort_by,
        sort_order=order,
        page=_int(params, "page", 1, MAX_PAGE),
        limit=limit,
        pending=pending,
    )


@dataclass(frozen=True)
class PageLinks:
    first: str | None
    previous: str | None
    next: str | None
    last: str | None


def page_links(query: RunQuery, page: Page, base: str) -> PageLinks:
    total_pages = page.total_pages

    def at(number: int) -> str:
        qs = query.params(page=number)
        return f"{base}?{qs}" if qs else base

    return PageLinks(
        first=at(1) if query.page > 1 else None,
        previous=at(min(query.page - 1, max(total_pages, 1))) if query.page > 1 else None,
        next=at(query.page + 1) if query.page < total_pages else None,
        last=at(total_pages) if query.page < total_pages else None,
    )
