"""The store conformance suite, the maintenance verbs: the reaper's rules in order on the
database clock, and retention's purge.
"""

from __future__ import annotations

import pytest
from conformance_support import (
    CLOCK_SLACK,
    DAY,
    GRACE,
    claim,
    get,
    store,
)
from factories import (
    engine_ready,
    handle,
    make_run,
    purge,
)

from runq.model import (
    Status,
    TerminationReason,
)
from runq.store.base import Store

pytestmark = pytest.mark.anyio

__all__ = ["engine_ready", "handle", "store"]  # fixtures used by name


# =========================================================================================
# reaper (its rules, in order)
# =========================================================================================


async def test_reaper_rules_in_order(store: Store) -> None:
    stale = GRACE * 2
    # Rule 1 beats rule 4 (attempts left) and rule 3 (exhausted).
    ni_left = await make_run(
        store, Status.RUNNING, max_attempts=3, non_idempotent=True, lease_age=stale
    )
    ni_done = await make_run(
        store, Status.RUNNING, max_attempts=1, non_idempotent=True, lease_age=stale
    )
    # Rule 2 beats rule 4 and rule 3.
    inline_left = await make_run(
        store, Status.RUNNING, max_attempts=3, save_request=False, lease_age=stale
    )
    inline_done = await make_run(
        store, Status.RUNNING, max_attempts=1, save_request=False, lease_age=stale
    )
    # Rule 3.
    exhausted = await make_run(
        store, Status.RUNNING, attempt=2, max_attempts=2, lease_age=stale, deployment_id="gpu"
    )
    # Rule 4.
    retry = await make_run(
        store, Status.RUNNING, max_attempts=2, lease_age=stale, deployment_id="gpu"
    )
    now = await store.now()
    report = await store.reap_stale(lock_grace_seconds=GRACE, limit=50)

    assert report.requeued == 1
    assert report.requeued_ids == [retry.id]
    assert report.dead_lettered == 5
    assert set(report.dead_lettered_ids) == {
        ni_left.id,
        ni_done.id,
        inline_left.id,
        inline_done.id,
        exhausted.id,
    }
    for run in (ni_left, ni_done, inline_left, inline_done):
        got = await get(store, run.id)
        assert got.status is Status.FAILED, run.id
        assert got.termination_reason is TerminationReason.NOT_RETRYABLE, run.id
        assert got.completed_at is not None
        assert got.error
        assert (got.locked_by, got.locked_at) == (None, None)
    got = await get(store, exhausted.id)
    assert got.status is Status.FAILED
    assert got.termination_reason is TerminationReason.RETRIES_EXHAUSTED
    assert got.error is not None
    assert "max_attempts" in got.error
    assert "requeue" in got.error.lower()
    got = await get(store, retry.id)
    assert got.status is Status.QUEUED
    assert got.attempt == 1
    assert (got.locked_by, got.locked_at) == (None, None)
    assert got.available_at == pytest.approx(now, abs=CLOCK_SLACK)
    assert got.deployment_id == "gpu", "a reaped retry keeps its deployment"
    assert got.termination_reason is None
    [again] = await claim(store, deployment_id="gpu")
    assert (again.id, again.attempt) == (retry.id, 2)


async def test_reaper_leaves_fresh_leases_and_other_statuses_alone(store: Store) -> None:
    fresh = await make_run(store, Status.RUNNING, max_attempts=2, lease_age=GRACE - 5)
    paused = await make_run(store, Status.PAUSED, finished_ago=GRACE * 10)
    queued = await make_run(store, Status.QUEUED)
    done = await make_run(store, Status.COMPLETED, finished_ago=GRACE * 10)
    before = {r.id: await get(store, r.id) for r in (fresh, paused, queued, done)}
    report = await store.reap_stale(lock_grace_seconds=GRACE, limit=50)
    assert (report.requeued, report.dead_lettered) == (0, 0)
    for rid, run in before.items():
        assert await get(store, rid) == run


async def test_reaper_uses_the_database_clock(store: Store) -> None:
    run = await make_run(store, Status.RUNNING, max_attempts=2)
    assert (await store.reap_stale(lock_grace_seconds=GRACE, limit=50)).requeued == 0
    store.clock_offset_seconds = GRACE - 2
    assert (await store.reap_stale(lock_grace_seconds=GRACE, limit=50)).requeued == 0
    assert (await get(store, run.id)).status is Status.RUNNING
    store.clock_offset_seconds = GRACE + 2
    report = await store.reap_stale(lock_grace_seconds=GRACE, limit=50)
    assert report.requeued_ids == [run.id]


async def test_heartbeat_keeps_the_reaper_away(store: Store) -> None:
    run = await make_run(store, Status.RUNNING, worker="w1", max_attempts=2)
    store.clock_offset_seconds = GRACE - 5
    await store.heartbeat_many("w1", [run.lease])
    store.clock_offset_seconds = GRACE + 5
    report = await store.reap_stale(lock_grace_seconds=GRACE, limit=50)
    assert (report.requeued, report.dead_lettered) == (0, 0)
    assert (await get(store, run.id)).locked_by == "w1"


async def test_reaper_limit_bounds_one_pass(store: Store) -> None:
    runs = [await make_run(store, Status.RUNNING, max_attempts=2) for _ in range(5)]
    store.clock_offset_seconds = GRACE * 2
    first = await store.reap_stale(lock_grace_seconds=GRACE, limit=2)
    assert first.requeued + first.dead_lettered == 2
    statuses = [(await get(store, r.id)).status for r in runs]
    assert statuses.count(Status.RUNNING) == 3
    second = await store.reap_stale(lock_grace_seconds=GRACE, limit=10)
    assert second.requeued == 3
    assert set(first.requeued_ids) | set(second.requeued_ids) == {r.id for r in runs}


# =========================================================================================
# purge (retention)
# =========================================================================================


async def test_purge_deletes_old_final_runs_only(store: Store) -> None:
    old = [
        await make_run(store, Status.COMPLETED, finished_ago=DAY + 60),
        await make_run(store, Status.FAILED, finished_ago=DAY + 60),
        await make_run(store, Status.CANCELLED, finished_ago=DAY + 60),
        await make_run(
            store, Status.CANCELLED, cancelled_from=Status.RUNNING, finished_ago=DAY * 2
        ),
    ]
    recent = await make_run(store, Status.COMPLETED, finished_ago=DAY - 600)
    paused = await make_run(store, Status.PAUSED, finished_ago=DAY * 5)
    running = await make_run(store, Status.RUNNING, max_attempts=2)
    queued = await make_run(store, Status.QUEUED)
    store.clock_offset_seconds = 0
    report = await purge(store, retention_seconds=DAY, paused_retention_seconds=0)
    assert report.deleted == 4
    for run in old:
        assert await store.get(run.id) is None
    for run in (recent, paused, running, queued):
        assert await store.get(run.id) is not None, run.status
    assert await store.count_runs() == 4


async def test_purge_never_touches_old_queued_or_running_runs(store: Store) -> None:
    queued = await make_run(store, Status.QUEUED)
    running = await make_run(store, Status.RUNNING, max_attempts=2)
    store.clock_offset_seconds = DAY * 30
    report = await purge(store, retention_seconds=DAY, paused_retention_seconds=DAY)
    assert report.deleted == 0
    assert await store.get(queued.id) is not None
    assert await store.get(running.id) is not None


async def test_purge_deletes_paused_runs_only_with_a_paused_retention(store: Store) -> None:
    old_paused = await make_run(store, Status.PAUSED, finished_ago=1000)
    young_paused = await make_run(store, Status.PAUSED, finished_ago=10)
    report = await purge(store, retention_seconds=DAY, paused_retention_seconds=0)
    assert report.deleted == 0
    report = await purge(store, retention_seconds=DAY, paused_retention_seconds=500)
    assert report.deleted == 1
    assert await store.get(old_paused.id) is None
    assert await store.get(young_paused.id) is not None


async def test_purge_works_in_batches(store: Store) -> None:
    for _ in range(7):
        await make_run(store, Status.COMPLETED, finished_ago=DAY * 2)
    keep = await make_run(store, Status.COMPLETED)
    report = await purge(store, retention_seconds=DAY, paused_retention_seconds=0, batch_size=3)
    assert report.deleted == 7
    assert report.batches in (3, 4)
    assert await store.count_runs() == 1
    assert await store.get(keep.id) is not None


async def test_purge_stops_after_max_batches(store: Store) -> None:
    for _ in range(7):
        await make_run(store, Status.FAILED, finished_ago=DAY * 2)
    report = await purge(
        store, retention_seconds=DAY, paused_retention_seconds=0, batch_size=3, max_batches=2
    )
    assert (report.deleted, report.batches) == (6, 2)
    assert await store.count_runs() == 1
    rest = await purge(store, retention_seconds=DAY, paused_retention_seconds=0)
    assert rest.deleted == 1
