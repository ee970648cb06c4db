"""Connection-level statements and the SQL fragments several statement groups share."""

from __future__ import annotations

from runq.model import ACTIVE_STATUSES, FINAL_STATUSES
from runq.store.statements import (
    fenced,
    status_list,
)

#: The database clock in epoch seconds, plus the (test-only) offset bound as ``?``.
NOW = "SELECT (julianday('now') - 2440587.5) * 86400.0 + ?"

BEGIN_IMMEDIATE = "BEGIN IMMEDIATE"

BEGIN = "BEGIN"

COMMIT = "COMMIT"

ROLLBACK = "ROLLBACK"

PING = "SELECT 1"

FINAL_IN = f"status IN ({status_list(FINAL_STATUSES)})"  # the final index's predicate

ACTIVE_IN = f"status IN ({status_list(ACTIVE_STATUSES)})"  # the session index's predicate

LEASE_CLEAR = "locked_by = NULL, locked_at = NULL"

FENCE = "id = :id AND attempt = :attempt AND locked_by = :worker AND status = 'running'"


def fence(verb: str) -> str:
    """The lease fence of a worker's write: it cannot land on a run that was reaped and
    claimed again by someone else meanwhile."""
    fenced(verb)
    return FENCE


def pragmas(busy_timeout_seconds: float, *, query_only: bool) -> tuple[str, ...]:
    """The settings of every connection, applied once when it opens."""
    settings = (
        f"PRAGMA busy_timeout = {int(busy_timeout_seconds * 1000)}",
        "PRAGMA journal_mode = WAL",  # readers never block the writer, nor it them
        "PRAGMA synchronous = NORMAL",  # durable across process crashes in WAL mode
        "PRAGMA temp_store = MEMORY",
    )
    return (*settings, "PRAGMA query_only = 1") if query_only else settings


COMPONENT = "(r.component_type || '/' || r.component_id)"

# The budget rule (``:bu`` users, ``:bc`` configurations, ``:bp`` [user, configuration]
# pairs, JSON arrays): each holds when the run is NOT blocked.
BLOCKED_USER = "coalesce(r.user_id, '') NOT IN (SELECT value FROM json_each(:bu))"
BLOCKED_CONFIGURATION = "coalesce(r.configuration, '') NOT IN (SELECT value FROM json_each(:bc))"
BLOCKED_PAIR = (
    "NOT EXISTS (SELECT 1 FROM json_each(:bp) p"
    " WHERE json_extract(p.value, '$[0]') = coalesce(r.user_id, '')"
    " AND json_extract(p.value, '$[1]') = coalesce(r.configuration, ''))"
)
