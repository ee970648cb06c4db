"""The status counts of ``stats`` and ``health`` come from run_counts (migration 0011),
kept by triggers on the run table: after every kind of write they must equal a direct
``COUNT(*)`` of the run table, on both engines, and a database migrated with runs already
in it must start from the right counts."""

from __future__ import annotations

import pytest
from factories import (
    StoreHandle,
    claim_one,
    engine_ready,
    handle,
    make_run,
    new_run,
    purge,
    stale_lease,
    submit,
)

from runq.model import Completion, Status

pytestmark = pytest.mark.anyio

__all__ = ["engine_ready", "handle"]  # fixtures used by name

DAY = 86400.0
GRACE = 60.0


async def direct_counts(h: StoreHandle) -> dict[str, int]:
    rows = await h.raw_fetch("SELECT status, count(*) AS n FROM {runs} GROUP BY status")
    return {r["status"]: int(r["n"]) for r in rows}


async def assert_exact(h: StoreHandle, step: str) -> None:
    expected = await direct_counts(h)
    stats = await h.store.stats()
    health = await h.store.health(lock_grace_seconds=GRACE, worker_max_age_seconds=60)
    assert {k: v for k, v in stats.counts.items() if v} == expected, step
    assert {k: v for k, v in health.counts.items() if v} == expected, step


async def test_counts_follow_every_transition(handle: StoreHandle) -> None:
    store = handle.store
    await assert_exact(handle, "empty")
    runs = [await submit(store) for _ in range(6)]
    await store.submit_many([new_run() for _ in range(5)])
    await store.submit_batch([new_run(), new_run()], max_queue_depth=0)
    await assert_exact(handle, "submit, submit_many, submit_batch")

    claimed = await store.claim("w1", 4, deployment_id=None)
    assert len(claimed) == 4
    await assert_exact(handle, "claim")
    await store.heartbeat_many("w1", [r.lease for r in claimed])
    await assert_exact(handle, "heartbeat")

    done = await store.complete_many(
        "w1", [Completion(run_id=r.id, attempt=r.attempt) for r in claimed[:2]]
    )
    assert len(done.applied) == 2
    await assert_exact(handle, "complete_many")
    await store.fail("w1", claimed[2].lease, error="boom", retryable=True, retry_in_seconds=0)
    await assert_exact(handle, "fail, retried")
    await store.fail("w1", claimed[3].lease, error="boom", retryable=False, retry_in_seconds=0)
    await assert_exact(handle, "fail, final")

    queued = [r for r in runs if r.id not in {c.id for c in claimed}]
    await store.cancel(queued[0].id)
    await assert_exact(handle, "cancel queued")
    running = await claim_one(store, queued[1], "w2")
    await store.cancel(running.id)
    await assert_exact(handle, "cancel running (requested only)")
    assert await store.settle_cancelled("w2", running.lease)
    await assert_exact(handle, "settle cancelled")

    await store.requeue(queued[0].id, clear_cancellation=True, force=True, lock_grace_seconds=GRACE)
    await assert_exact(handle, "requeue")

    paused = await make_run(store, Status.PAUSED)
    await assert_exact(handle, "pause")
    await store.continue_(paused.id, {"ok": True})
    await assert_exact(handle, "continue")

    retried = await claim_one(store, await submit(store, max_attempts=2), "w3")
    dead = await claim_one(store, await submit(store), "w3")
    for run in (retried, dead):
        await stale_lease(store, run, "w3", GRACE * 2)
    report = await store.reap_stale(lock_grace_seconds=GRACE, limit=10)
    assert (report.requeued_ids, report.dead_lettered_ids) == ([retried.id], [dead.id])
    await assert_exact(handle, "reap")

    for _ in range(3):
        await make_run(store, Status.COMPLETED, finished_ago=DAY * 2)
    await assert_exact(handle, "old final runs")
    deleted = await purge(store, retention_seconds=DAY, paused_retention_seconds=0)
    assert deleted.deleted == 3
    await assert_exact(handle, "purge")


async def test_a_status_whose_runs_are_all_gone_is_not_listed(handle: StoreHandle) -> None:
    run = await submit(handle.store)
    await handle.store.cancel(run.id)
    stats = await handle.store.stats()
    assert stats.counts == {"cancelled": 1}


async def test_migrating_a_database_with_runs_backfills_the_counts(
    handle: StoreHandle,
) -> None:
    """An installation upgraded to 0011 with runs in it: the counts start exact."""
    store = handle.store
    for status in (Status.QUEUED, Status.QUEUED, Status.RUNNING, Status.FAILED):
        await make_run(store, status)
    await undo_counts_migration(handle)
    await submit(store)  # written while no trigger counts it
    assert await store.migrate() == 1
    await assert_exact(handle, "after the migration")
    await submit(store)
    await assert_exact(handle, "a write after the migration")


async def undo_counts_migration(h: StoreHandle) -> None:
    """Back to the schema before 0011's counts: no triggers, no table, not recorded."""
    s = h.schema
    if h.engine == "postgres":
        for name in ("insert", "update", "delete", "truncate"):
            await h.raw_execute(f"DROP TRIGGER runs_count_{name} ON {s}.runs")
        await h.raw_execute(f"DROP TABLE {s}.run_counts")
        await h.raw_execute(f"DELETE FROM {s}.schema_migrations WHERE version = 11")
        return
    for name in ("insert", "update", "delete"):
        await h.raw_execute(f"DROP TRIGGER {s}_runs_count_{name}")
    await h.raw_execute(f"DROP TABLE {s}_run_counts")
    await h.raw_execute(f"DELETE FROM {s}_schema_migrations WHERE version = 11")


async def test_truncate_resets_the_counts(handle: StoreHandle) -> None:
    if handle.engine != "postgres":
        pytest.skip("TRUNCATE is PostgreSQL's")
    await submit(handle.store)
    await handle.raw_execute(f"TRUNCATE {handle.schema}.runs CASCADE")
    await assert_exact(handle, "truncate")


async def test_oldest_queued_age_across_deployments_and_priorities(
    handle: StoreHandle,
) -> None:
    """The loose index scan visits every (deployment_id, priority) group: the oldest due
    run of a deployment may sit in any of its priorities, behind delayed runs of others."""
    store = handle.store
    # (offset at submission, deployment, priority, delay): the oldest due run per deployment
    # is the one marked, in a priority other than the first the index meets.
    plan = [
        (0.0, "", 5, 0.0),  # "" oldest: priority 5
        (10.0, "", -1, 0.0),
        (20.0, "", 0, 0.0),
        (0.0, "a", -1, 500.0),  # delayed: not waiting
        (5.0, "a", 0, 0.0),  # "a" oldest
        (30.0, "a", 7, 0.0),
        (0.0, "b", 3, 500.0),  # "b" has nothing due
    ]
    for offset, deployment, priority, delay in plan:
        store.clock_offset_seconds = offset
        await submit(
            store, deployment_id=deployment or None, priority=priority, delay_seconds=delay
        )
    store.clock_offset_seconds = 100.0
    health = await store.health(lock_grace_seconds=GRACE, worker_max_age_seconds=60)
    ages = health.oldest_queued_age_by_deployment
    assert set(ages) == {"", "a"}
    assert ages[""] == pytest.approx(100, abs=2)
    assert ages["a"] == pytest.approx(95, abs=2)
    assert health.oldest_queued_age_seconds == pytest.approx(100, abs=2)
    stats = await store.stats()
    assert stats.oldest_queued_age_seconds == pytest.approx(100, abs=2)
