"""Statements of a run under a lease: heartbeat, complete, fail, pause, settle."""

from __future__ import annotations

from runq.store.postgres.statements.fragments import RUNNING_STATUS, unindexed
from runq.store.statements import sources_of, target_of


def lifecycle_sql(s: str, now: str) -> dict[str, str]:
    """Operator and producer transitions (cancel, continue, requeue)."""
    cancel_src = sources_of("cancel")
    requeue_src = sources_of("requeue")
    return {
        # queued/paused: cancelled at once; running: intent only. The cancel is recorded in
        # both cases, so an operator requeue keeps it unless told to clear it.
        "cancel": f"""
            UPDATE {s}.runs SET
                cancel_requested = true, updated_at = {now},
                status = CASE WHEN status IN ({cancel_src})
                    THEN {target_of("cancel")} ELSE status END,
                termination_reason = CASE WHEN status IN ({cancel_src})
                    THEN 'cancelled' ELSE termination_reason END,
                completed_at = CASE WHEN status IN ({cancel_src})
                    THEN {now} ELSE completed_at END,
                resume_state = CASE WHEN status IN ({cancel_src})
                    THEN NULL ELSE resume_state END,
                decision = CASE WHEN status IN ({cancel_src}) THEN NULL ELSE decision END
            WHERE id = $1 AND {unindexed(f"status IN ({cancel_src}, {RUNNING_STATUS})")}
            RETURNING *""",
        "continue_": f"""
            UPDATE {s}.runs SET
                status = {target_of("continue")}, decision = $2,
                max_attempts = GREATEST(max_attempts, attempt + 1),
                available_at = {now}, continued_at = {now}, updated_at = {now}
            WHERE id = $1 AND {unindexed("status = 'paused'")}
            RETURNING *""",
        "requeue": f"""
            UPDATE {s}.runs SET
                status = {target_of("requeue")}, max_attempts = attempt + 1, available_at = {now},
                updated_at = {now}, error = NULL, error_detail = NULL, termination_reason = NULL,
                completed_at = NULL, locked_by = NULL, locked_at = NULL,
                non_idempotent = false,
                cancel_requested = CASE WHEN $2::bool THEN false ELSE cancel_requested END
            WHERE id = $1 AND {unindexed(f"status IN ({requeue_src})")}
              AND ($3::bool OR status <> 'failed' OR completed_at IS NULL
                   OR completed_at <= {now} - $4::float8)
            RETURNING *""",
    }
