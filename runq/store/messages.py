"""The texts both engines write into a run's ``error`` or raise as refusals.

Kept in one place so the two engines say exactly the same thing for the same event; the
conformance tests compare them.
"""

from __future__ import annotations

REAP_NON_IDEMPOTENT_ERROR = "lease expired inside a non-idempotent write section; not retried"
REAP_NO_REQUEST_ERROR = "lease expired and no saved request to retry"
#: With ``{id}``, ``{attempt}`` and ``{max_attempts}`` of the run; the engines also write it
#: as an SQL expression over those columns (``runq.store.statements.reap_exhausted_error``).
REAP_EXHAUSTED_TEMPLATE = (
    "lease expired after attempt {attempt} of {max_attempts}; "
    "requeue with `runq jobs requeue {id}` or raise max_attempts"
)
#: The prefix of the ``error`` of a claimed run given back because its sealed values did not
#: open with this process's keys.
NOT_EXECUTED_PREFIX = "not executed: "


def reap_exhausted_error(run_id: str, attempt: int, max_attempts: int) -> str:
    return REAP_EXHAUSTED_TEMPLATE.format(id=run_id, attempt=attempt, max_attempts=max_attempts)


def not_executed(reason: BaseException) -> str:
    """The ``error`` of a claimed run put back because its sealed values did not open."""
    return f"{NOT_EXECUTED_PREFIX}{reason}"


def not_found(run_id: str) -> str:
    return f"no run {run_id}"


def cancel_refused(run_id: str, status: str) -> str:
    return f"run {run_id} is {status}; a finished run cannot be cancelled"


def continue_refused(run_id: str, status: str) -> str:
    return (
        f"run {run_id} is {status} and not waiting for a decision; "
        "only a paused run can be continued"
    )


def requeue_refused(run_id: str, status: str) -> str:
    return f"run {run_id} is {status}; only failed or cancelled runs can be requeued"


def requeue_too_soon(run_id: str, lock_grace_seconds: float) -> str:
    return (
        f"run {run_id} failed less than lock_grace_seconds ({lock_grace_seconds:g}s) ago; "
        "its worker may still be executing. Wait, or requeue with force"
    )


def idempotency_conflict(key: str, existing_component: str) -> str:
    return f"idempotency key {key!r} is already used for {existing_component}"


def queue_full(max_queue_depth: int) -> str:
    return f"the queue is full: {max_queue_depth} runs are queued (queue.max_queue_depth)"


def delayed_full(max_delayed: int) -> str:
    return f"too many delayed runs: {max_delayed} are waiting for their time (queue.max_delayed)"


def user_queue_full(max_queued_per_user: int) -> str:
    return (
        f"you have {max_queued_per_user} queued runs already (queue.max_queued_per_user); "
        "try again when some have run"
    )


_BATCH_GATES = {
    "due": ("due runs", "queue.max_queue_depth"),
    "delayed": ("delayed runs", "queue.max_delayed"),
    "user": ("of your runs", "queue.max_queued_per_user"),
}


def batch_too_big(kind: str, queued: int, adding: int, limit: int) -> str:
    what, key = _BATCH_GATES[kind]
    shown = f"{queued}" if queued < limit else f"{limit} or more"
    return (
        f"the batch does not fit: {shown} {what} are queued, the batch adds {adding}, "
        f"at most {limit} may be ({key}); nothing was stored"
    )


def run_exists(run_id: str) -> str:
    return f"run {run_id} already exists"


def bulk_refused(error: BaseException) -> str:
    return f"bulk insert refused (duplicate id or idempotency key): {error}"
