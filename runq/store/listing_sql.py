"""Run listings in SQL, written once for both engines.

A listing differs between the engines only where SQLite differs from PostgreSQL: the
table's name (``{schema}.runs`` / ``{schema}_runs``), how a parameter is spelled (``$n`` /
``?n``) and how the ``actor`` JSON column is read. Each engine's statements package gives
those three as a ``ListingDialect``; everything else - the filter terms, the keyset
condition, the ORDER BY with its tie-break, LIMIT and OFFSET, the count - is built here.

Only whitelisted identifiers, enum values and ints are interpolated; every value is a
parameter. LIMIT and OFFSET are literals so the (generic) plan knows a page is small and
walks an index in sort order (on PostgreSQL ``runs_listing_idx``, or
``runs_user_listing_idx`` for one user) instead of sorting every matching row. The id
tie-break keeps pages stable when many rows share the sort value, and makes
(created_at, id) a keyset cursor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from runq.limits import like_pattern
from runq.listing import DEFAULT_SORT_BY, SORTABLE_FIELDS, RunCursor, RunFilter
from runq.store.statements import status_list

#: Stated by every listing: the predicate of PostgreSQL's runs_listing_idx (always true),
#: so that index serves the listings and no lookup by id can walk it (migration 0015).
LISTED = "created_at IS NOT NULL"


class ListingDialect(NamedTuple):
    """What a run listing's SQL differs by between the engines."""

    #: The run table of a schema: ``"{schema}.runs"`` or ``"{schema}_runs"``.
    table: str
    #: The n-th (1-based) parameter: ``$n`` or ``?n`` (numbered: a value may appear twice).
    placeholder: Callable[[int], str]
    #: "Submitted by a service account", read from the ``actor`` JSON column.
    service_account: str


def sort_column(sort_by: str) -> str:
    """A whitelisted column name; anything else falls back to ``created_at``."""
    return sort_by if sort_by in SORTABLE_FIELDS else DEFAULT_SORT_BY


def sort_direction(sort_order: str) -> str:
    return "ASC" if sort_order.lower() == "asc" else "DESC"


#: Sortable columns that may hold NULL (the others are NOT NULL in the schema).
_NULLABLE_SORT_FIELDS = frozenset({"completed_at", "user_id"})


def order_by(sort_by: str, sort_order: str) -> str:
    """``ORDER BY`` body for the listing: whitelisted column, NULLs last in both directions
    (both engines spell it the same; their defaults differ), id as the tie-breaker so pages
    never overlap."""
    column, direction = sort_column(sort_by), sort_direction(sort_order)
    # NULLS LAST only where a NULL can occur: on a NOT NULL column it would only stop
    # SQLite from walking an index in order.
    nulls = " NULLS LAST" if column in _NULLABLE_SORT_FIELDS else ""
    return f"{column} {direction}{nulls}, id {direction}"


class Params:
    """Positional parameters of one statement; ``placeholder`` spells the n-th (1-based)
    in the engine's dialect (``?`` on SQLite, ``$n`` on PostgreSQL)."""

    def __init__(self, placeholder: Callable[[int], str]) -> None:
        self.values: list[Any] = []
        self._placeholder = placeholder

    def add(self, value: Any) -> str:
        self.values.append(value)
        return self._placeholder(len(self.values))


def _component_clauses(pattern: str, p: Params) -> list[str]:
    """An exact name and ``type/*`` compare columns (index-friendly); other globs use LIKE."""
    if pattern == "*":
        return []
    ctype, _, cid = pattern.partition("/")
    if "*" not in pattern:
        return [f"component_type = {p.add(ctype)}", f"component_id = {p.add(cid)}"]
    if cid == "*":
        return [f"component_type = {p.add(ctype)}"]
    like = f"(component_type || '/' || component_id) LIKE {p.add(like_pattern(pattern))}"
    return [f"{like} ESCAPE '\\'"]


def listing_clauses(
    where: RunFilter,
    after: RunCursor | None,
    sort_order: str,
    p: Params,
    *,
    service_account: str,
) -> list[str]:
    """The WHERE terms of a run listing; ``service_account`` is the engine's SQL test of
    "submitted by a service account" on the ``actor`` JSON column. The status list is
    literal (enum values only) so it plans like a custom plan."""
    clauses: list[str] = [LISTED]
    if where.statuses:
        clauses.append(f"status IN ({status_list(frozenset(where.statuses))})")
    if where.component is not None:
        clauses += _component_clauses(where.component, p)
    for column in ("session_id", "user_id"):
        value = getattr(where, column)
        if value is not None:
            clauses.append(f"{column} = {p.add(value)}")
    if where.deployment_id is not None:
        # '' is stored for "no deployment".
        clauses.append(f"deployment_id = {p.add(where.deployment_id)}")
    if where.owner is not None:
        clauses.append(f"user_id = {p.add(where.owner)} AND NOT {service_account}")
    if where.created_after is not None:
        clauses.append(f"created_at >= {p.add(where.created_after)}")
    if where.created_before is not None:
        clauses.append(f"created_at < {p.add(where.created_before)}")
    if after is not None:
        op = ">" if sort_direction(sort_order) == "ASC" else "<"
        # The row comparison is the keyset condition; the plain bound on created_at lets
        # an index whose next column is not id (status_created_idx) seek too.
        at = p.add(after.created_at)
        clauses.append(f"created_at {op}= {at} AND (created_at, id) {op} ({at}, {p.add(after.id)})")
    return clauses


def where_sql(clauses: list[str]) -> str:
    return f" WHERE {' AND '.join(clauses)}" if clauses else ""


def _body(
    dialect: ListingDialect, schema: str, where: RunFilter, after: RunCursor | None, order: str
) -> tuple[str, list[Any]]:
    p = Params(dialect.placeholder)
    clauses = listing_clauses(where, after, order, p, service_account=dialect.service_account)
    return f"FROM {dialect.table.format(schema=schema)}{where_sql(clauses)}", p.values


def list_page(
    dialect: ListingDialect,
    schema: str,
    where: RunFilter,
    *,
    after: RunCursor | None,
    sort_by: str,
    sort_order: str,
    limit: int,
    offset: int,
) -> tuple[str, list[Any]]:
    """One page of a run listing, and its arguments."""
    body, args = _body(dialect, schema, where, after, sort_order)
    page = (
        f"SELECT * {body} ORDER BY {order_by(sort_by, sort_order)} "
        f"LIMIT {int(limit)} OFFSET {int(offset)}"
    )
    return page, args


def count_listed(dialect: ListingDialect, schema: str, where: RunFilter) -> tuple[str, list[Any]]:
    """How many runs the listing's filter matches (the cursor does not count)."""
    body, args = _body(dialect, schema, where, None, "desc")
    return f"SELECT count(*) {body}", args
