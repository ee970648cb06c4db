"""Flow-control statements: pauses, rate windows, queue-depth gates, usage and budgets."""

from __future__ import annotations

from runq.store.sqlite.statements.fragments import (
    ACTIVE_IN,
    BLOCKED_CONFIGURATION,
    BLOCKED_PAIR,
    BLOCKED_USER,
    COMPONENT,
)


def usage_sql(t: str, u: str) -> dict[str, str]:
    return {
        "add_run_usage": (
            f"UPDATE {t} SET tokens = tokens + :tokens, cost = cost + :cost WHERE id = :id"
        ),
        "usage_upsert": (
            f"INSERT INTO {u} (scope, subject, period_start, cost, tokens, runs)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (scope, subject, period_start) DO UPDATE SET"
            " cost = cost + excluded.cost, tokens = tokens + excluded.tokens,"
            " runs = runs + excluded.runs"
        ),
        "usage_get": (
            f"SELECT cost, tokens, runs FROM {u}"
            " WHERE scope = ? AND subject = ? AND period_start = ?"
        ),
        "usage_in_period": (
            f"SELECT scope, subject, period_start, cost, tokens, runs FROM {u}"
            " WHERE scope = ? AND period_start = ?"
        ),
    }


def depth_gates_sql(t: str) -> dict[str, str]:
    """Bounded counts for submit's gates: due runs (the global depth), delayed runs (their own
    bound, so far-future runs cannot fill the queue), and one user's queued runs."""
    queued = f"SELECT 1 FROM {t} WHERE status = 'queued'"
    return {
        "count_due": f"SELECT count(*) FROM ({queued} AND available_at <= ? LIMIT ?)",
        "count_delayed": f"SELECT count(*) FROM ({queued} AND available_at > ? LIMIT ?)",
        "count_user_queued": (
            f"SELECT count(*) FROM (SELECT 1 FROM {t} WHERE user_id = ? AND status = 'queued'"
            " LIMIT ?)"
        ),
    }


def limits_sql(t: str, rates: str, pauses: str) -> dict[str, str]:
    return {
        "running_by_component": (
            f"SELECT {COMPONENT} AS component, r.concurrency_key, count(*) AS n"
            f" FROM {t} r WHERE r.status = 'running' GROUP BY 1, 2"
        ),
        "rate_windows_get": (
            f"SELECT pattern, window_start, used FROM {rates}"
            " WHERE pattern IN (SELECT value FROM json_each(?))"
        ),
        # A new window starts over.
        "rate_windows_bump": (
            f"INSERT INTO {rates} (pattern, window_start, used) VALUES (?, ?, ?)"
            " ON CONFLICT (pattern) DO UPDATE SET"
            f" used = CASE WHEN {rates}.window_start = excluded.window_start"
            f" THEN {rates}.used + excluded.used ELSE excluded.used END,"
            " window_start = excluded.window_start"
        ),
        "pause_insert": (
            f"INSERT INTO {pauses} (id, kind, target, like_pattern, reason, created_by,"
            " created_at) VALUES (?, ?, ?, NULL, ?, ?, ?)"
            " ON CONFLICT (kind, target) DO NOTHING"
        ),
        "pause_get": f"SELECT * FROM {pauses} WHERE kind = ? AND target = ?",
        "pause_delete": f"DELETE FROM {pauses} WHERE id = ? OR (kind = ? AND target = ?)"
        " RETURNING *",
        "pause_list": f"SELECT * FROM {pauses} ORDER BY created_at, id",
        # The session rule for one run (:id, :session), as the claim applies it.
        "session_ahead": (
            f"SELECT EXISTS (SELECT 1 FROM {t} s WHERE s.session_id = :session"
            f" AND s.{ACTIVE_IN} AND s.id <> :id AND (s.id < :id OR s.status <> 'queued'))"
        ),
        # Ready, delayed, and the ready runs the budget excludes (:bu, :bc, :bp as in the
        # claim; '[]' excludes nothing).
        "queued_by_component": (
            f"SELECT {COMPONENT} AS component, r.deployment_id,"
            " sum(r.available_at <= :now) AS ready, sum(r.available_at > :now) AS delayed,"
            " sum(r.available_at <= :now AND NOT"
            f" ({BLOCKED_USER} AND {BLOCKED_CONFIGURATION} AND {BLOCKED_PAIR})) AS budget_held"
            f" FROM {t} r WHERE r.status = 'queued' GROUP BY 1, 2"
        ),
    }
