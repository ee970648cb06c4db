"""A run's event log statements: append, list, trim."""

from __future__ import annotations

from runq.store.sqlite.statements.fragments import fence


def events_sql(t: str, e: str) -> dict[str, str]:
    """The event log. Lifecycle events are written by the triggers of migration 0005; a
    handler's batch checks its fence and numbers its rows after the last stored one, all in
    one write transaction (SQLite has one writer at a time, so nobody numbers in between)."""
    return {
        "events_fence": f"SELECT 1 FROM {t} WHERE {fence('append_events')}",
        "events_last_seq": f"SELECT coalesce(max(seq), 0) FROM {e} WHERE run_id = ?",
        "events_insert": (
            f"INSERT INTO {e} (run_id, seq, attempt, at, kind, data) VALUES (?, ?, ?, ?, ?, ?)"
        ),
        "events_list": (
            f"SELECT seq, attempt, at, kind, info, data FROM {e}"
            " WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?"
        ),
        # The second parameter: drop lifecycle details too (level none).
        "events_trim": (
            f"UPDATE {e} SET data = NULL, info = CASE WHEN :all THEN NULL ELSE info END"
            " WHERE run_id = :id AND (data IS NOT NULL OR (:all AND info IS NOT NULL))"
        ),
        "events_sealed": (
            f"SELECT seq, data FROM {e} WHERE run_id = ? AND data IS NOT NULL ORDER BY seq"
        ),
        "events_reseal": f"UPDATE {e} SET data = ? WHERE run_id = ? AND seq = ?",
        # Key rotation: the handler data of the runs in (first, last] not sealed under the
        # key given (bytes 4-11 of a sealed value are its key id).
        "events_rotation_select": (
            f"SELECT run_id, seq, data FROM {e} WHERE run_id > ? AND run_id <= ?"
            " AND data IS NOT NULL AND substr(data, 4, 8) IS NOT ? ORDER BY run_id, seq"
        ),
        # Compare-and-set on the old value: data trimmed meanwhile stays trimmed.
        "events_rotation_update": (
            f"UPDATE {e} SET data = ? WHERE run_id = ? AND seq = ? AND data = ?"
        ),
    }
