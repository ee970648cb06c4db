"""SQL fragments both engines build their statements from.

Only what is spelled the same in both dialects lives here: the transition guards taken
from ``runq.model.TRANSITIONS``, the listing's ORDER BY, and the reaper's error text as an
SQL expression. Each engine's full statements are in its own ``statements`` module.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from runq.errors import ConfigError
from runq.limits import like_pattern
from runq.listing import DEFAULT_SORT_BY, SORTABLE_FIELDS, RunCursor, RunFilter
from runq.model import TRANSITIONS, Status
from runq.store.messages import REAP_EXHAUSTED_TEMPLATE

#: The schema name is interpolated into every statement, so it must be a plain identifier.
_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_schema(schema: str) -> str:
    """``schema`` when it is a lower-case SQL identifier; ``ConfigError`` otherwise."""
    if not _SCHEMA_RE.match(schema):
        raise ConfigError("store.schema", f"{schema!r} must be a lower-case SQL identifier")
    return schema


def status_list(statuses: frozenset[Status]) -> str:
    """``'a', 'b'`` for an SQL ``IN (...)``, in the order the statuses are declared.

    Declaration order, because SQLite uses a partial index only when the query repeats
    the index's predicate term for term, and the migrations list statuses in that order.
    Built from enum values only, never from user input.
    """
    return ", ".join(f"'{s.value}'" for s in Status if s in statuses)


def sources_of(verb: str) -> str:
    """The statuses ``verb`` may start from, for ``status IN (...)``."""
    return status_list(TRANSITIONS[verb].sources)


def target_of(verb: str) -> str:
    """The one status ``verb`` ends in, quoted; verbs with several targets decide in SQL."""
    (target,) = TRANSITIONS[verb].targets
    return f"'{target.value}'"


def fenced(verb: str) -> str:
    """Check that ``verb`` is a fenced write before building its fenced statement."""
    if not TRANSITIONS[verb].fenced:
        raise AssertionError(f"{verb} is not a fenced transition")
    return verb


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


def reap_exhausted_error(alias: str = "") -> str:
    """The reaper's "retries exhausted" text as an SQL expression over the row's columns
    (``||`` works on both engines, and both cast the integers to text)."""
    p = f"{alias}." if alias else ""
    parts = re.split(r"\{(\w+)\}", REAP_EXHAUSTED_TEMPLATE)
    out: list[str] = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(p + part)  # a column name: id, attempt, max_attempts
        elif part:
            out.append("'" + part.replace("'", "''") + "'")
    return "(" + " || ".join(out) + ")"


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
    clauses: list[str] = []
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
