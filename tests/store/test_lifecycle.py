"""The store conformance suite, a claimed run's writes: heartbeats, fenced completions and
failures with their retry rules.
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

from runq.model import (
    Completion,
    FailOutcome,
    Lease,
    Resume,
    Status,
    TerminationReason,
)
from runq.store.base import Store

pytestmark = pytest.mark.anyio

__all__ = ["engine_ready", "handle", "store"]  # fixtures used by name


# =========================================================================================
# heartbeat
# =========================================================================================


async def test_heartbeat_renews_every_lease(store: Store) -> None:
    await submit(store)
    await submit(store)
    runs = await claim(store)
    store.clock_offset_seconds = 10
    now = await store.now()
    result = await store.heartbeat_many("w1", [r.lease for r in runs])
    assert set(result.renewed) == {r.lease for r in runs}
    assert result.lost == ()
    assert result.cancel_requested == ()
    for r in runs:
        got = await get(store, r.id)
        assert got.locked_at == pytest.approx(now, abs=CLOCK_SLACK)
        assert got.status is Status.RUNNING


async def test_heartbeat_reports_lost_leases_and_changes_nothing(store: Store) -> None:
    mine = await make_run(store, Status.RUNNING, worker="w1", max_attempts=3)
    theirs = await make_run(store, Status.RUNNING, worker="w2")
    done = await make_run(store, Status.COMPLETED, worker="w1")
    before = {r.id: await get(store, r.id) for r in (mine, theirs, done)}
    store.clock_offset_seconds = 5
    wrong_attempt = Lease(mine.id, mine.attempt + 1)
    unknown = Lease(ordered_run_id(), 1)
    result = await store.heartbeat_many(
        "w1", [mine.lease, wrong_attempt, theirs.lease, done.lease, unknown]
    )
    assert result.renewed == (mine.lease,)
    assert set(result.lost) == {wrong_attempt, theirs.lease, done.lease, unknown}
    assert len(result.lost) == 4
    assert await get(store, theirs.id) == before[theirs.id]
    assert await get(store, done.id) == before[done.id]


async def test_heartbeat_reports_cancel_requested(store: Store) -> None:
    a = await make_run(store, Status.RUNNING)
    b = await make_run(store, Status.RUNNING)
    await store.cancel(a.id)
    result = await store.heartbeat_many("w-test", [a.lease, b.lease])
    assert set(result.renewed) == {a.lease, b.lease}
    assert result.cancel_requested == (a.id,)


async def test_heartbeat_of_nothing_is_empty(store: Store) -> None:
    result = await store.heartbeat_many("w1", [])
    assert (result.renewed, result.lost, result.cancel_requested) == ((), (), ())


# =========================================================================================
# complete
# =========================================================================================


async def test_complete_many_completes_the_batch(handle: StoreHandle) -> None:
    store = handle.store
    a = await make_run(store, Status.RUNNING, worker="w1")
    b = await make_run(store, Status.RUNNING, worker="w1")
    now = await store.now()
    result = await store.complete_many(
        "w1",
        [
            Completion(run_id=a.id, attempt=1, answer={"text": "ANSWER-A"}),
            Completion(
                run_id=b.id,
                attempt=1,
                answer="partial",
                termination_reason=TerminationReason.BUDGET_EXHAUSTED,
            ),
        ],
    )
    assert set(result.applied) == {a.id, b.id}
    assert result.fenced_off == ()
    ga, gb = await get(store, a.id), await get(store, b.id)
    assert ga.status is Status.COMPLETED
    assert ga.answer == {"text": "ANSWER-A"}
    assert ga.termination_reason is TerminationReason.COMPLETED
    assert ga.completed_at == pytest.approx(now, abs=CLOCK_SLACK)
    assert (ga.locked_by, ga.locked_at) == (None, None)
    assert ga.attempt == 1
    assert gb.answer == "partial"
    assert gb.termination_reason is TerminationReason.BUDGET_EXHAUSTED
    raw = await handle.raw_row(a.id)
    assert raw["answer"] is not None
    assert b"ANSWER-A" not in raw["answer"]


async def test_complete_without_keep_answer_stores_none(handle: StoreHandle) -> None:
    run = await make_run(handle.store, Status.RUNNING)
    await handle.store.complete_many(
        "w-test", [Completion(run_id=run.id, attempt=1, answer="secret", keep_answer=False)]
    )
    got = await get(handle.store, run.id)
    assert (got.status, got.answer) == (Status.COMPLETED, None)
    assert (await handle.raw_row(run.id))["answer"] is None


async def test_complete_clears_resume_state_and_decision(handle: StoreHandle) -> None:
    store = handle.store
    paused = await make_run(store, Status.PAUSED, max_attempts=1)
    await store.continue_(paused.id, {"approved": True})
    [again] = await claim(store, "w1", run_id=paused.id)
    assert again.resume == Resume(state={"step": 1}, decision={"approved": True})
    await store.complete_many("w1", [Completion(run_id=again.id, attempt=again.attempt)])
    got = await get(store, paused.id)
    assert got.resume is None
    raw = await handle.raw_row(paused.id)
    assert (raw["resume_state"], raw["decision"]) == (None, None)


async def test_complete_is_fenced(store: Store) -> None:
    running = await make_run(store, Status.RUNNING, worker="w1", max_attempts=2)
    queued = await make_run(store, Status.QUEUED)
    done = await make_run(store, Status.COMPLETED, worker="w1")
    paused = await make_run(store, Status.PAUSED, worker="w1")
    snapshot = {r.id: await get(store, r.id) for r in (running, queued, done, paused)}
    bad = [
        Completion(run_id=running.id, attempt=1),  # wrong worker (below)
        Completion(run_id=queued.id, attempt=0),
        Completion(run_id=done.id, attempt=1),
        Completion(run_id=paused.id, attempt=1),
        Completion(run_id=ordered_run_id(), attempt=1),
    ]
    result = await store.complete_many("w-other", bad)
    assert result.applied == ()
    assert len(result.fenced_off) == 5
    assert set(result.fenced_off) >= {running.id, queued.id, done.id, paused.id}
    wrong_attempt = await store.complete_many("w1", [Completion(run_id=running.id, attempt=2)])
    assert (wrong_attempt.applied, wrong_attempt.fenced_off) == ((), (running.id,))
    for rid, before in snapshot.items():
        assert await get(store, rid) == before, f"a fenced-off completion changed {rid}"


async def test_complete_many_applies_the_valid_part_of_a_mixed_batch(store: Store) -> None:
    good = await make_run(store, Status.RUNNING, worker="w1")
    stolen = await make_run(store, Status.RUNNING, worker="w2")
    result = await store.complete_many(
        "w1",
        [Completion(run_id=good.id, attempt=1), Completion(run_id=stolen.id, attempt=1)],
    )
    assert (result.applied, result.fenced_off) == ((good.id,), (stolen.id,))
    assert (await get(store, good.id)).status is Status.COMPLETED
    assert (await get(store, stolen.id)).status is Status.RUNNING


async def test_complete_many_of_nothing(store: Store) -> None:
    result = await store.complete_many("w1", [])
    assert (result.applied, result.fenced_off) == ((), ())


async def test_zombie_completion_after_reap_and_reclaim_is_fenced(store: Store) -> None:
    run = await make_run(store, Status.RUNNING, worker="w1", max_attempts=2, lease_age=120)
    report = await store.reap_stale(lock_grace_seconds=GRACE, limit=10)
    assert report.requeued_ids == [run.id]
    [second] = await claim(store, "w2")
    assert second.attempt == 2
    zombie = await store.complete_many("w1", [Completion(run_id=run.id, attempt=1, answer="old")])
    assert zombie.fenced_off == (run.id,)
    got = await get(store, run.id)
    assert (got.status, got.locked_by, got.attempt, got.answer) == (
        Status.RUNNING,
        "w2",
        2,
        None,
    )
    hb = await store.heartbeat_many("w1", [Lease(run.id, 1)])
    assert (hb.renewed, hb.lost) == ((), (Lease(run.id, 1),))


# =========================================================================================
# fail
# =========================================================================================


async def test_retryable_fail_with_attempts_left_schedules_a_retry(store: Store) -> None:
    run = await make_run(store, Status.RUNNING, max_attempts=3)
    now = await store.now()
    outcome = await store.fail(
        "w-test", run.lease, error="rate limited", retryable=True, retry_in_seconds=40
    )
    assert outcome is FailOutcome.RETRY_SCHEDULED
    got = await get(store, run.id)
    assert got.status is Status.QUEUED
    assert got.available_at == pytest.approx(now + 40, abs=CLOCK_SLACK)
    assert got.error == "rate limited"
    assert (got.locked_by, got.locked_at) == (None, None)
    assert got.attempt == 1
    assert got.completed_at is None
    assert got.termination_reason is None
    assert await claim(store) == []
    store.clock_offset_seconds = 41
    [again] = await claim(store)
    assert (again.id, again.attempt) == (run.id, 2)


async def test_retryable_fail_without_attempts_left_dead_letters(store: Store) -> None:
    run = await make_run(store, Status.RUNNING, attempt=2, max_attempts=2)
    outcome = await store.fail(
        "w-test", run.lease, error="boom", retryable=True, retry_in_seconds=1
    )
    assert outcome is FailOutcome.DEAD_LETTERED
    got = await get(store, run.id)
    assert got.status is Status.FAILED
    assert got.termination_reason is TerminationReason.RETRIES_EXHAUSTED
    assert got.error == "boom"
    assert got.completed_at is not None
    assert (got.locked_by, got.locked_at) == (None, None)


async def test_not_retryable_fail_dead_letters_at_once(store: Store) -> None:
    run = await make_run(store, Status.RUNNING, max_attempts=5)
    outcome = await store.fail(
        "w-test", run.lease, error="permanent", retryable=False, retry_in_seconds=1
    )
    assert outcome is FailOutcome.DEAD_LETTERED
    got = await get(store, run.id)
    assert got.status is Status.FAILED
    assert got.termination_reason is TerminationReason.NOT_RETRYABLE
    assert got.completed_at is not None


async def test_non_idempotent_run_is_never_retried(store: Store) -> None:
    run = await make_run(store, Status.RUNNING, max_attempts=5, non_idempotent=True)
    assert (await get(store, run.id)).non_idempotent is True
    outcome = await store.fail(
        "w-test", run.lease, error="boom", retryable=True, retry_in_seconds=0
    )
    assert outcome is FailOutcome.DEAD_LETTERED
    got = await get(store, run.id)
    assert got.status is Status.FAILED
    assert got.termination_reason in (
        TerminationReason.NOT_RETRYABLE,
        TerminationReason.RETRIES_EXHAUSTED,
    )


async def test_leaving_the_non_idempotent_section_allows_retries_again(store: Store) -> None:
    run = await make_run(store, Status.RUNNING, max_attempts=2, non_idempotent=True)
    assert await store.set_non_idempotent("w-test", run.lease, False) is True
    assert (await get(store, run.id)).non_idempotent is False
    outcome = await store.fail("w-test", run.lease, error="x", retryable=True, retry_in_seconds=0)
    assert outcome is FailOutcome.RETRY_SCHEDULED


async def test_set_non_idempotent_is_fenced(store: Store) -> None:
    run = await make_run(store, Status.RUNNING, worker="w1")
    before = await get(store, run.id)
    assert await store.set_non_idempotent("w2", run.lease, True) is False
    assert await store.set_non_idempotent("w1", Lease(run.id, 2), True) is False
    assert await get(store, run.id) == before


async def test_fail_is_fenced(store: Store) -> None:
    run = await make_run(store, Status.RUNNING, worker="w1", max_attempts=3)
    done = await make_run(store, Status.COMPLETED, worker="w1")
    before = await get(store, run.id)
    before_done = await get(store, done.id)
    assert (
        await store.fail("w2", run.lease, error="x", retryable=True, retry_in_seconds=0)
        is FailOutcome.FENCED_OFF
    )
    assert (
        await store.fail("w1", Lease(run.id, 2), error="x", retryable=False, retry_in_seconds=0)
        is FailOutcome.FENCED_OFF
    )
    assert (
        await store.fail("w1", done.lease, error="x", retryable=False, retry_in_seconds=0)
        is FailOutcome.FENCED_OFF
    )
    assert await get(store, run.id) == before
    assert await get(store, done.id) == before_done
