"""SQL fragments both engines build their statements from.

Only what is spelled the same in both dialects lives here: the schema name check, the
transition guards taken from ``runq.model.TRANSITIONS`` and the reaper's error text as an
SQL expression (run listings, written once, are ``listing_sql.py``). Each engine's full
statements are in its own ``statements`` package.
"""

from __future__ import annotations

import re

from runq.errors import ConfigError
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
