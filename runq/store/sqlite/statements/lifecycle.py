"""Statements of a run under a lease: heartbeat, complete, fail, pause, settle."""

from __future__ import annotations

from runq.store.sqlite.statements.fragments import LEASE_CLEAR, fence
from runq.store.statements import (
    sources_of,
    target_of,
)


def fail_sql(t: str) -> str:
    # The retry rule lives in the statement, so it is decided on the row as it is at the
    # moment of the write, not as the worker last saw it.
    retry = ":retryable AND attempt < max_attempts AND non_idempotent = 0"
    return (
        f"UPDATE {t} SET"
        f" status = CASE WHEN {retry} THEN 'queued' ELSE 'failed' END,"
        f" available_at = CASE WHEN {retry} THEN :now + :delay ELSE available_at END,"
        f" termination_reason = CASE WHEN {retry} THEN NULL"
        "   WHEN NOT :retryable THEN 'not_retryable'"
        "   WHEN attempt >= max_attempts THEN 'retries_exhausted'"
        "   ELSE 'not_retryable' END,"  # attempts left, but inside a non-idempotent section
        f" completed_at = CASE WHEN {retry} THEN NULL ELSE :now END,"
        f" resume_state = CASE WHEN {retry} THEN resume_state ELSE NULL END,"
        f" decision = CASE WHEN {retry} THEN decision ELSE NULL END,"
        f" error = :error, error_detail = :error_detail, updated_at = :now, {LEASE_CLEAR}"
        f" WHERE {fence('fail')} RETURNING status"
    )


def lifecycle_sql(t: str) -> dict[str, str]:
    return {
        "cancel_now": (
            f"UPDATE {t} SET status = {target_of('cancel')}, termination_reason = 'cancelled',"
            f" cancel_requested = 1, completed_at = :now, updated_at = :now, {LEASE_CLEAR},"
            " resume_state = NULL, decision = NULL"
            f" WHERE id = :id AND status IN ({sources_of('cancel')}) RETURNING *"
        ),
        "cancel_request": (
            f"UPDATE {t} SET cancel_requested = 1, updated_at = :now"
            f" WHERE id = :id AND status IN ({sources_of('request_cancel')}) RETURNING *"
        ),
        "continue_": (
            f"UPDATE {t} SET status = {target_of('continue')}, decision = :decision,"
            " max_attempts = MAX(max_attempts, attempt + 1), available_at = :now,"
            " continued_at = :now,"
            f" updated_at = :now, {LEASE_CLEAR}"
            f" WHERE id = :id AND status IN ({sources_of('continue')}) RETURNING *"
        ),
        "requeue": (
            f"UPDATE {t} SET status = {target_of('requeue')}, max_attempts = attempt + 1,"
            " available_at = :now, updated_at = :now, error = NULL, error_detail = NULL,"
            " termination_reason = NULL,"
            f" completed_at = NULL, {LEASE_CLEAR}, non_idempotent = 0,"
            " cancel_requested = CASE WHEN :clear THEN 0 ELSE cancel_requested END"
            f" WHERE id = :id AND status IN ({sources_of('requeue')}) RETURNING *"
        ),
    }
