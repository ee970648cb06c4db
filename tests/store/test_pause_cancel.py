"""The store conformance suite, pause and continue, cancel, and the operator's requeue, each
with its fencing and conflicts.
"""

from __future__ import annotations

import pytest
from conformance_support import (
    CLOCK_SLACK,
    GRACE,
    claim,
    get,
    store,
)
from factories import (
    StoreHandle,
    engine_ready,
    handle,
    make_run,
    submit,
)
from helpers import ordered_run_id

from runq.errors import (
    Conflict,
    InvalidPayload,
    InvalidTransition,
    NotFound,
)
from runq.model import (
    Completion,
    Lease,
    Resume,
    Status,
    TerminationReason,
)
from runq.store.base import Store

pytestmark = pytest.mark.anyio

__all__ = ["engine_ready", "handle", "store"]  # fixtures used by name


# =========================================================================================
# pause and continue
# =========================================================================================


async def test_pause_seals_the_resume_state_and_clears_the_lease(handle: StoreHandle) -> None:
    store = handle.store
    run = await make_run(store, Status.RUNNING, max_attempts=1)
    state = {"transcript": ["RESUME-MARKER"], "pending": [{"tool": "write"}]}
    assert await store.pause("w-test", run.lease, reason="approval", state=state) is True
    got = await get(store, run.id)
    assert got.status is Status.PAUSED
    assert got.pause_reason == "approval"
    assert got.resume == Resume(state=state, decision=None)
    assert (got.locked_by, got.locked_at) == (None, None)
    assert got.attempt == 1
    assert got.completed_at is None
    assert got.termination_reason is None
    raw = await handle.raw_row(run.id)
    assert raw["resume_state"] is not None
    assert b"RESUME-MARKER" not in raw["resume_state"]


async def test_pause_is_fenced(store: Store) -> None:
    run = await make_run(store, Status.RUNNING, worker="w1")
    before = await get(store, run.id)
    assert await store.pause("w2", run.lease, reason="approval", state={}) is False
    assert await store.pause("w1", Lease(run.id, 9), reason="approval", state={}) is False
    assert await get(store, run.id) == before


async def test_pause_with_unencodable_state_changes_nothing(store: Store) -> None:
    run = await make_run(store, Status.RUNNING)
    before = await get(store, run.id)
    with pytest.raises(InvalidPayload):
        await store.pause("w-test", run.lease, reason="approval", state={"x": object()})
    assert await get(store, run.id) == before


async def test_continue_queues_the_run_with_the_decision(store: Store) -> None:
    paused = await make_run(
        store, Status.PAUSED, attempt=1, max_attempts=1, deployment_id="gpu", state={"s": 1}
    )
    now = await store.now()
    cont = await store.continue_(paused.id, {"approved": True, "by": "ops"})
    assert cont.status is Status.QUEUED
    assert cont.resume == Resume(state={"s": 1}, decision={"approved": True, "by": "ops"})
    assert cont.max_attempts == paused.attempt + 1 == 2
    assert cont.available_at == pytest.approx(now, abs=CLOCK_SLACK)
    assert cont.pause_reason == "approval", "kept for history"
    assert cont.deployment_id == "gpu", "a continuation keeps its deployment"
    assert await get(store, paused.id) == cont
    [running] = await claim(store, deployment_id="gpu")
    assert running.attempt == 2 <= running.max_attempts
    assert running.resume == Resume(state={"s": 1}, decision={"approved": True, "by": "ops"})


async def test_second_continue_returns_the_same_run_unchanged(store: Store) -> None:
    paused = await make_run(store, Status.PAUSED)
    first = await store.continue_(paused.id, "yes")
    second = await store.continue_(paused.id, "no")
    assert second == first
    assert second.resume is not None
    assert second.resume.decision == "yes"
    [_running] = await claim(store)
    third = await store.continue_(paused.id, "maybe")
    assert third == await get(store, paused.id)
    assert (third.status, third.attempt, third.locked_by) == (Status.RUNNING, 2, "w1")
    assert third.resume is not None
    assert third.resume.decision == "yes"


async def test_continue_after_a_second_pause_is_a_new_decision(store: Store) -> None:
    paused = await make_run(store, Status.PAUSED)
    await store.continue_(paused.id, "first")
    [running] = await claim(store)
    assert await store.pause("w1", running.lease, reason="input", state={"s": 2}) is True
    again = await get(store, paused.id)
    assert again.resume == Resume(state={"s": 2}, decision=None), "pause clears the decision"
    cont = await store.continue_(paused.id, "second")
    assert cont.status is Status.QUEUED
    assert cont.max_attempts == 3
    assert cont.resume == Resume(state={"s": 2}, decision="second")
    assert cont.pause_reason == "input"


@pytest.mark.parametrize(
    "status", [Status.QUEUED, Status.RUNNING, Status.COMPLETED, Status.FAILED, Status.CANCELLED]
)
async def test_continue_of_a_run_never_paused_or_final_is_a_conflict(
    store: Store, status: Status
) -> None:
    run = await make_run(store, status)
    before = await get(store, run.id)
    with pytest.raises(Conflict):
        await store.continue_(run.id, "yes")
    assert await get(store, run.id) == before


async def test_continue_of_a_finished_continuation_is_a_conflict(store: Store) -> None:
    paused = await make_run(store, Status.PAUSED)
    await store.continue_(paused.id, "yes")
    [running] = await claim(store)
    await store.complete_many("w1", [Completion(run_id=running.id, attempt=running.attempt)])
    with pytest.raises(Conflict):
        await store.continue_(paused.id, "again")


async def test_continue_unknown_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        await store.continue_(ordered_run_id(), "yes")


async def test_continue_with_unencodable_decision_changes_nothing(store: Store) -> None:
    paused = await make_run(store, Status.PAUSED)
    with pytest.raises(InvalidPayload):
        await store.continue_(paused.id, {"x": object()})
    assert await get(store, paused.id) == paused


# =========================================================================================
# cancel
# =========================================================================================


async def test_cancel_queued_is_immediate(store: Store) -> None:
    run = await submit(store, delay_seconds=100)
    now = await store.now()
    got = await store.cancel(run.id)
    assert got.status is Status.CANCELLED
    assert got.termination_reason is TerminationReason.CANCELLED
    assert got.completed_at == pytest.approx(now, abs=CLOCK_SLACK)
    assert got.cancel_requested is True, "the cancel is recorded (only a requeue clears it)"
    assert await get(store, run.id) == got


async def test_cancel_paused_is_immediate_and_clears_resume_state(handle: StoreHandle) -> None:
    paused = await make_run(handle.store, Status.PAUSED)
    got = await handle.store.cancel(paused.id)
    assert got.status is Status.CANCELLED
    assert got.termination_reason is TerminationReason.CANCELLED
    assert got.completed_at is not None
    assert got.resume is None
    assert (await handle.raw_row(paused.id))["resume_state"] is None


async def test_cancel_running_records_intent_until_settled(store: Store) -> None:
    run = await make_run(store, Status.RUNNING, worker="w1")
    got = await store.cancel(run.id)
    assert got.status is Status.RUNNING
    assert got.cancel_requested is True
    assert got.locked_by == "w1"
    assert await store.settle_cancelled("w2", run.lease) is False
    assert await store.settle_cancelled("w1", Lease(run.id, 2)) is False
    assert (await get(store, run.id)).status is Status.RUNNING
    assert await store.settle_cancelled("w1", run.lease) is True
    done = await get(store, run.id)
    assert done.status is Status.CANCELLED
    assert done.termination_reason is TerminationReason.CANCELLED
    assert done.completed_at is not None
    assert (done.locked_by, done.locked_at) == (None, None)


async def test_cancel_cancelled_is_unchanged(store: Store) -> None:
    run = await make_run(store, Status.CANCELLED)
    store.clock_offset_seconds = 10
    again = await store.cancel(run.id)
    assert again == run


@pytest.mark.parametrize("status", [Status.COMPLETED, Status.FAILED])
async def test_cancel_of_a_finished_run_is_a_conflict(store: Store, status: Status) -> None:
    run = await make_run(store, status)
    with pytest.raises(Conflict):
        await store.cancel(run.id)
    assert await get(store, run.id) == run


async def test_cancel_unknown_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        await store.cancel(ordered_run_id())


# =========================================================================================
# requeue (operator verb)
# =========================================================================================


async def test_requeue_failed_run_after_the_grace(store: Store) -> None:
    run = await make_run(
        store,
        Status.FAILED,
        attempt=2,
        max_attempts=2,
        termination_reason=TerminationReason.RETRIES_EXHAUSTED,
        finished_ago=GRACE + 30,
    )
    now = await store.now()
    got = await store.requeue(
        run.id, clear_cancellation=False, force=False, lock_grace_seconds=GRACE
    )
    assert got.status is Status.QUEUED
    assert got.max_attempts == 3 == run.attempt + 1
    assert got.attempt == 2
    assert got.available_at == pytest.approx(now, abs=CLOCK_SLACK)
    assert (got.error, got.termination_reason, got.completed_at) == (None, None, None)
    assert (got.locked_by, got.locked_at) == (None, None)
    assert await get(store, run.id) == got
    [again] = await claim(store)
    assert (again.id, again.attempt, again.max_attempts) == (run.id, 3, 3)


async def test_requeue_of_a_recent_failure_is_a_conflict_unless_forced(store: Store) -> None:
    run = await make_run(store, Status.FAILED, finished_ago=GRACE / 2)
    with pytest.raises(Conflict) as excinfo:
        await store.requeue(run.id, clear_cancellation=False, force=False, lock_grace_seconds=GRACE)
    assert not isinstance(excinfo.value, InvalidTransition)
    assert await get(store, run.id) == run
    got = await store.requeue(
        run.id, clear_cancellation=False, force=True, lock_grace_seconds=GRACE
    )
    assert got.status is Status.QUEUED


async def test_requeue_grace_is_measured_on_the_database_clock(store: Store) -> None:
    run = await make_run(store, Status.FAILED)
    with pytest.raises(Conflict):
        await store.requeue(run.id, clear_cancellation=False, force=False, lock_grace_seconds=GRACE)
    store.clock_offset_seconds = GRACE + 1
    got = await store.requeue(
        run.id, clear_cancellation=False, force=False, lock_grace_seconds=GRACE
    )
    assert got.status is Status.QUEUED


async def test_requeue_of_a_recent_cancel_needs_no_force(store: Store) -> None:
    run = await make_run(store, Status.CANCELLED)
    got = await store.requeue(
        run.id, clear_cancellation=True, force=False, lock_grace_seconds=GRACE
    )
    assert got.status is Status.QUEUED


async def test_requeue_keeps_a_recorded_cancel_unless_cleared(store: Store) -> None:
    for cancelled_from in (Status.QUEUED, Status.RUNNING, Status.PAUSED):
        kept = await make_run(store, Status.CANCELLED, cancelled_from=cancelled_from)
        cleared = await make_run(store, Status.CANCELLED, cancelled_from=cancelled_from)
        got_kept = await store.requeue(
            kept.id, clear_cancellation=False, force=False, lock_grace_seconds=GRACE
        )
        got_cleared = await store.requeue(
            cleared.id, clear_cancellation=True, force=False, lock_grace_seconds=GRACE
        )
        assert got_kept.cancel_requested is True, cancelled_from
        assert got_cleared.cancel_requested is False, cancelled_from
        assert got_kept.status is got_cleared.status is Status.QUEUED
        assert got_kept.termination_reason is None
        assert got_kept.max_attempts == kept.attempt + 1


async def test_kept_cancel_is_reported_at_the_first_heartbeat(store: Store) -> None:
    run = await make_run(store, Status.CANCELLED)
    await store.requeue(run.id, clear_cancellation=False, force=False, lock_grace_seconds=GRACE)
    [running] = await claim(store, "w1")
    hb = await store.heartbeat_many("w1", [running.lease])
    assert hb.cancel_requested == (run.id,)


async def test_requeue_clears_the_non_idempotent_mark(store: Store) -> None:
    run = await make_run(store, Status.RUNNING, non_idempotent=True, lease_age=GRACE * 2)
    report = await store.reap_stale(lock_grace_seconds=GRACE, limit=10)
    assert report.dead_lettered_ids == [run.id]
    got = await store.requeue(
        run.id, clear_cancellation=False, force=True, lock_grace_seconds=GRACE
    )
    assert got.non_idempotent is False
    assert got.status is Status.QUEUED


@pytest.mark.parametrize("status", [Status.QUEUED, Status.RUNNING, Status.PAUSED, Status.COMPLETED])
async def test_requeue_of_other_statuses_is_an_invalid_transition(
    store: Store, status: Status
) -> None:
    run = await make_run(store, status)
    with pytest.raises(InvalidTransition) as excinfo:
        await store.requeue(run.id, clear_cancellation=True, force=True, lock_grace_seconds=GRACE)
    assert not isinstance(excinfo.value, Conflict), "a wrong status is a 400, not a 409"
    assert await get(store, run.id) == run


async def test_requeue_unknown_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        await store.requeue(
            ordered_run_id(), clear_cancellation=False, force=True, lock_grace_seconds=GRACE
        )


async def test_requeue_does_not_bypass_fencing(store: Store) -> None:
    run = await make_run(store, Status.RUNNING, worker="w1", lease_age=GRACE * 2)
    await store.reap_stale(lock_grace_seconds=GRACE, limit=10)  # max_attempts 1: dead letter
    assert (await get(store, run.id)).status is Status.FAILED
    await store.requeue(run.id, clear_cancellation=False, force=True, lock_grace_seconds=GRACE)
    [second] = await claim(store, "w2")
    assert second.attempt == 2
    late = await store.complete_many("w1", [Completion(run_id=run.id, attempt=1, answer="late")])
    assert late.fenced_off == (run.id,)
    assert (await get(store, run.id)).locked_by == "w2"
