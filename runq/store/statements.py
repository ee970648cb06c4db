"""SQL fragments both engines build their statements from.

Only what is spelled the same in both dialects lives here: the transition guards taken
from ``runq.model.TRANSITIONS``, the listing's ORDER BY, and the reaper's error text as an
SQL expression. Each engine's full statements are in its own ``statements`` module.
"""

from __future__ import annotations

import re

from runq.errors import ConfigError
from runq.model import DEFAULT_SORT_BY, SORTABLE_FIELDS, TRANSITIONS, Status
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
