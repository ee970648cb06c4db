"""The store conformance suite, the state machine as a whole: every documented transition, and
the test factories themselves.
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
    claim_one,
    engine_ready,
    handle,
    make_run,
    shifted_clock,
    stale_lease,
    submit,
)

from runq.model import (
    Completion,
    FailOutcome,
    Status,
)
from runq.store.base import Store

pytestmark = pytest.mark.anyio

__all__ = ["engine_ready", "handle", "store"]  # fixtures used by name


# =========================================================================================
# the state machine as a whole
# =========================================================================================


async def test_a_run_walks_every_documented_transition(store: Store) -> None:
    """queued → running → queued (retry) → running → paused → queued (continue) → running →
    cancelled → queued (requeue) → running → failed → queued (requeue) → running → completed."""
    run = await submit(store, max_attempts=2)
    [r] = await claim(store)
    assert await store.fail("w1", r.lease, error="e", retryable=True, retry_in_seconds=0) is (
        FailOutcome.RETRY_SCHEDULED
    )
    [r] = await claim(store)
    assert r.attempt == 2
    assert await store.pause("w1", r.lease, reason="approval", state=1)
    await store.continue_(run.id, 2)
    [r] = await claim(store)
    assert (r.attempt, r.max_attempts) == (3, 3)
    await store.cancel(run.id)
    assert await store.settle_cancelled("w1", r.lease)
    await store.requeue(run.id, clear_cancellation=True, force=False, lock_grace_seconds=GRACE)
    [r] = await claim(store)
    assert (r.attempt, r.max_attempts, r.cancel_requested) == (4, 4, False)
    assert await store.fail("w1", r.lease, error="e", retryable=False, retry_in_seconds=0) is (
        FailOutcome.DEAD_LETTERED
    )
    await store.requeue(run.id, clear_cancellation=False, force=True, lock_grace_seconds=GRACE)
    [r] = await claim(store)
    assert r.attempt == 5
    done = await store.complete_many("w1", [Completion(run_id=run.id, attempt=5, answer="ok")])
    assert done.applied == (run.id,)
    final = await get(store, run.id)
    assert (final.status, final.answer, final.resume) == (Status.COMPLETED, "ok", None)


@pytest.mark.parametrize("ending", ["fail", "settle_cancelled", "reap"])
async def test_resume_state_is_cleared_whenever_the_run_becomes_final(
    handle: StoreHandle, ending: str
) -> None:
    """Resume state is kept verbatim (sealed) and cleared when the run is final."""
    store = handle.store
    paused = await make_run(store, Status.PAUSED, state={"transcript": "long"})
    await store.continue_(paused.id, {"approved": True})
    [running] = await claim(store, "w1")
    assert running.resume is not None
    if ending == "fail":
        outcome = await store.fail(
            "w1", running.lease, error="x", retryable=False, retry_in_seconds=0
        )
        assert outcome is FailOutcome.DEAD_LETTERED
    elif ending == "settle_cancelled":
        await store.cancel(paused.id)
        assert await store.settle_cancelled("w1", running.lease) is True
    else:
        await stale_lease(store, running, "w1", GRACE * 2)
        running = await get(store, paused.id)
        assert running.attempt == running.max_attempts
        report = await store.reap_stale(lock_grace_seconds=GRACE, limit=10)
        assert report.dead_lettered_ids == [paused.id]
    final = await get(store, paused.id)
    assert final.is_final
    assert final.resume is None
    raw = await handle.raw_row(paused.id)
    assert (raw["resume_state"], raw["decision"]) == (None, None)


@pytest.mark.parametrize(
    "status",
    [
        Status.QUEUED,
        Status.RUNNING,
        Status.COMPLETED,
        Status.FAILED,
        Status.CANCELLED,
        Status.PAUSED,
    ],
)
async def test_factory_builds_every_state(store: Store, status: Status) -> None:
    run = await make_run(
        store,
        status,
        session_id="s-f",
        deployment_id="gpu",
        user_id="u-f",
        configuration="c-f",
        priority=3,
    )
    assert run.status is status
    assert (run.session_id, run.deployment_id, run.user_id) == ("s-f", "gpu", "u-f")
    assert (run.configuration, run.priority) == ("c-f", 3)
    assert run.attempt == (0 if status in (Status.QUEUED, Status.CANCELLED) else 1)
    assert run.attempt <= run.max_attempts
    assert (run.completed_at is not None) is run.is_final
    retried = await make_run(
        store,
        status if status is not Status.CANCELLED else Status.QUEUED,
        attempt=2,
        max_attempts=3,
    )
    assert retried.attempt == 2


async def test_claim_one_helper_refuses_loudly(store: Store) -> None:
    """The factory itself must fail loudly rather than build a wrong state."""
    run = await submit(store, delay_seconds=100)
    with pytest.raises(AssertionError):
        await claim_one(store, run, "w1")


async def test_stale_lease_helper(store: Store) -> None:
    run = await make_run(store, Status.RUNNING, worker="w1", max_attempts=2)
    aged = await stale_lease(store, run, "w1", GRACE + 10)
    now = await store.now()
    assert aged.locked_at is not None
    assert now - aged.locked_at == pytest.approx(GRACE + 10, abs=CLOCK_SLACK)
    async with shifted_clock(store, 5):
        assert await store.now() == pytest.approx(now + 5, abs=CLOCK_SLACK)
    assert store.clock_offset_seconds == 0
