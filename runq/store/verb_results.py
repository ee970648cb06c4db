"""What a verb builds from what its statement returned, engine-neutral: the claim order
and the opened claimed runs, heartbeat and fence results, a failure's outcome, and the
checks a continue and a requeue make on the row they read."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

from runq.errors import SealError
from runq.model import Completion, FailOutcome, FenceResult, HeartbeatResult, Lease, Run, Status
from runq.seal import Sealer
from runq.store.codec import RowLike, row_to_run

R = TypeVar("R", bound=RowLike)


def in_claim_order(rows: Iterable[R]) -> list[R]:
    """Claimed rows in claim order: RETURNING gives them in no particular order, and
    callers start runs in the order they were claimed."""
    return sorted(rows, key=lambda r: (r["priority"], r["available_at"], r["id"]))


def open_claimed(rows: Sequence[R], sealer: Sealer) -> tuple[list[Run], list[tuple[R, SealError]]]:
    """Open claimed rows; the ones whose sealed values do not open come back separately,
    with the reason, for the engine to give back."""
    runs: list[Run] = []
    broken: list[tuple[R, SealError]] = []
    for row in rows:
        try:
            runs.append(row_to_run(row, sealer))
        except SealError as e:
            broken.append((row, e))
    return runs, broken


def heartbeat_result(
    leases: Sequence[Lease],
    renewed: set[tuple[str, int]],
    cancel_requested: Iterable[str],
    busy: Iterable[str] = (),
) -> HeartbeatResult:
    """Split ``leases`` by whether (id, attempt) was renewed, or left alone because its row
    was ``busy`` (held by another transaction), else lost; cancel requests sorted by id."""
    held = set(busy)
    return HeartbeatResult(
        renewed=tuple(le for le in leases if (le.run_id, le.attempt) in renewed),
        lost=tuple(
            le for le in leases if (le.run_id, le.attempt) not in renewed and le.run_id not in held
        ),
        cancel_requested=tuple(sorted(cancel_requested)),
        busy=tuple(
            le for le in leases if (le.run_id, le.attempt) not in renewed and le.run_id in held
        ),
    )


def fence_result(completions: Sequence[Completion], applied: set[str]) -> FenceResult:
    """Which completions were written and which were fenced off, in the caller's order."""
    return FenceResult(
        applied=tuple(c.run_id for c in completions if c.run_id in applied),
        fenced_off=tuple(c.run_id for c in completions if c.run_id not in applied),
    )


def fail_outcome(status: str | None) -> FailOutcome:
    """The outcome of a fenced fail from the status it wrote (None: fenced off)."""
    if status is None:
        return FailOutcome.FENCED_OFF
    if status == Status.QUEUED:
        return FailOutcome.RETRY_SCHEDULED
    return FailOutcome.DEAD_LETTERED


def is_repeat_continue(row: RowLike) -> bool:
    """A second continue of the same pause: its continuation is already queued or running."""
    return (
        row["status"] in (Status.QUEUED, Status.RUNNING)
        and row["continued_at"] is not None
        and row["decision"] is not None
    )


def requeue_is_too_soon(run: RowLike, *, now: float, force: bool, grace: float) -> bool:
    """A failed run's worker may still be executing within the lock grace after it failed."""
    completed_at = run["completed_at"]
    return (
        run["status"] == Status.FAILED
        and not force
        and completed_at is not None
        and completed_at > now - grace
    )
