"""Smoke tests of the SQLite engine alone (the conformance suite covers both engines)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from factories import purge
from helpers import ordered_run_id

from runq.errors import (
    Conflict,
    IdempotencyConflict,
    InvalidPayload,
    InvalidTransition,
    NotFound,
    QueueFull,
    StoreUnavailable,
)
from runq.listing import RunFilter
from runq.model import (
    Actor,
    BudgetBlock,
    Completion,
    FailOutcome,
    NewRun,
    Status,
    TerminationReason,
    UsageKey,
    WorkerInfo,
)
from runq.seal import KeyRing
from runq.store.sqlite import SqliteStore

KEY = bytes(range(32))


def new(**kw: object) -> NewRun:
    # Strictly increasing ids: "oldest first" must not depend on runs sharing a millisecond.
    base: dict[str, object] = {
        "component_type": "task",
        "component_id": "echo",
        "payload": {"x": 1},
        "id": ordered_run_id(),
    }
    base.update(kw)
    return NewRun(**base)  # type: ignore[arg-type]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "q.db", schema="runq", sealer=KeyRing([KEY]))
    await s.connect()
    assert await s.migrate() >= 1
    try:
        yield s
    finally:
        await s.close()


async def test_migrate_is_idempotent_and_current(store: SqliteStore) -> None:
    assert await store.migrate() == 0
    assert await store.schema_is_current()
    await store.ping()
    assert abs(await store.now() - __import__("time").time()) < 5


async def test_submit_claim_complete(store: SqliteStore) -> None:
    res = await store.submit(new(actor=Actor(user_id="u1")), max_queue_depth=10)
    assert res.created
    assert res.run.status == Status.QUEUED
    assert res.run.payload == {"x": 1}
    got = await store.get(res.run.id)
    assert got is not None
    assert got.payload == {"x": 1}
    assert got.actor.user_id == "u1"
    runs = await store.claim("w1", 5, deployment_id=None)
    assert [r.id for r in runs] == [res.run.id]
    run = runs[0]
    assert run.status == Status.RUNNING
    assert run.attempt == 1
    assert run.locked_by == "w1"
    fenced = await store.complete_many("w2", [Completion(run_id=run.id, attempt=1, answer=1)])
    assert fenced.fenced_off == (run.id,)
    ok = await store.complete_many("w1", [Completion(run_id=run.id, attempt=1, answer={"a": 2})])
    assert ok.applied == (run.id,)
    done = await store.get(run.id)
    assert done is not None
    assert done.status == Status.COMPLETED
    assert done.answer == {"a": 2}
    assert done.termination_reason == TerminationReason.COMPLETED
    assert done.locked_by is None


async def test_idempotency_and_depth(store: SqliteStore) -> None:
    a = await store.submit(new(idempotency_key="k"), max_queue_depth=1)
    b = await store.submit(new(idempotency_key="k"), max_queue_depth=1)
    assert b.run.id == a.run.id
    assert not b.created
    with pytest.raises(IdempotencyConflict):
        await store.submit(new(idempotency_key="k", component_id="other"), max_queue_depth=0)
    other_user = await store.submit(
        new(idempotency_key="k", actor=Actor(user_id="u")), max_queue_depth=0
    )
    assert other_user.created
    with pytest.raises(QueueFull):
        await store.submit(new(), max_queue_depth=2)
    with pytest.raises(InvalidPayload):
        await store.submit(new(payload={"x": object()}), max_queue_depth=0)


async def test_priority_affinity_and_sessions(store: SqliteStore) -> None:
    low = await store.submit(new(priority=5), max_queue_depth=0)
    high = await store.submit(new(priority=-1), max_queue_depth=0)
    gpu = await store.submit(new(deployment_id="gpu"), max_queue_depth=0)
    s1 = await store.submit(new(session_id="s"), max_queue_depth=0)
    s2 = await store.submit(new(session_id="s"), max_queue_depth=0)
    plain = await store.claim("w", 10, deployment_id=None)
    ids = [r.id for r in plain]
    assert ids[0] == high.run.id
    assert gpu.run.id not in ids
    assert s1.run.id in ids
    assert s2.run.id not in ids
    assert low.run.id == ids[-1]
    assert [r.id for r in await store.claim("w", 10, deployment_id="gpu")] == [gpu.run.id]
    # s2 waits until s1 is final
    assert await store.claim("w", 10, deployment_id=None) == []
    await store.complete_many("w", [Completion(run_id=s1.run.id, attempt=1)])
    assert [r.id for r in await store.claim("w", 10, deployment_id=None)] == [s2.run.id]


async def test_budget_block(store: SqliteStore) -> None:
    a = await store.submit(new(actor=Actor(user_id="a")), max_queue_depth=0)
    b = await store.submit(new(actor=Actor(user_id="b"), configuration="c"), max_queue_depth=0)
    c = await store.submit(new(), max_queue_depth=0)
    block = BudgetBlock(users=frozenset({"a"}), pairs=frozenset({("b", "c")}))
    got = await store.claim("w", 10, deployment_id=None, blocked=block)
    assert [r.id for r in got] == [c.run.id]
    got = await store.claim("w", 10, deployment_id=None, run_id=b.run.id)
    assert [r.id for r in got] == [b.run.id]
    assert a.run.id


async def test_fail_retry_and_dead_letter(store: SqliteStore) -> None:
    r = (await store.submit(new(max_attempts=2), max_queue_depth=0)).run
    (run,) = await store.claim("w", 1, deployment_id=None)
    out = await store.fail("w", run.lease, error="boom", retryable=True, retry_in_seconds=0)
    assert out == FailOutcome.RETRY_SCHEDULED
    (run,) = await store.claim("w", 1, deployment_id=None)
    assert run.attempt == 2
    assert await store.fail("x", run.lease, error="e", retryable=True, retry_in_seconds=0) == (
        FailOutcome.FENCED_OFF
    )
    out = await store.fail("w", run.lease, error="boom2", retryable=True, retry_in_seconds=0)
    assert out == FailOutcome.DEAD_LETTERED
    got = await store.get(r.id)
    assert got is not None
    assert got.termination_reason == TerminationReason.RETRIES_EXHAUSTED
    assert got.error == "boom2"
    with pytest.raises(Conflict):
        await store.requeue(r.id, clear_cancellation=False, force=False, lock_grace_seconds=60)
    again = await store.requeue(r.id, clear_cancellation=False, force=True, lock_grace_seconds=60)
    assert again.status == Status.QUEUED
    assert again.max_attempts == 3
    assert again.error is None


async def test_pause_continue_cancel(store: SqliteStore) -> None:
    r = (await store.submit(new(), max_queue_depth=0)).run
    with pytest.raises(Conflict):
        await store.continue_(r.id, "yes")
    (run,) = await store.claim("w", 1, deployment_id=None)
    assert await store.pause("w", run.lease, reason="approval", state={"s": 1})
    paused = await store.get(r.id)
    assert paused is not None
    assert paused.status == Status.PAUSED
    cont = await store.continue_(r.id, {"ok": True})
    assert cont.status == Status.QUEUED
    assert cont.max_attempts == 2
    assert cont.resume is not None
    assert cont.resume.state == {"s": 1}
    assert cont.resume.decision == {"ok": True}
    again = await store.continue_(r.id, {"ok": False})
    assert again.resume is not None
    assert again.resume.decision == {"ok": True}
    cancelled = await store.cancel(r.id)
    assert cancelled.status == Status.CANCELLED
    assert cancelled.resume is None
    assert (await store.cancel(r.id)).status == Status.CANCELLED
    with pytest.raises(Conflict):
        await store.continue_(r.id, 1)
    with pytest.raises(NotFound):
        await store.cancel("nope")
    q = await store.requeue(r.id, clear_cancellation=False, force=False, lock_grace_seconds=60)
    assert q.cancel_requested
    with pytest.raises(InvalidTransition):
        await store.requeue(r.id, clear_cancellation=True, force=False, lock_grace_seconds=60)


async def test_running_cancel_and_heartbeat(store: SqliteStore) -> None:
    await store.register_worker(WorkerInfo(id="w", hostname="h", pid=1, deployment_id=None))
    await store.submit(new(), max_queue_depth=0)
    (run,) = await store.claim("w", 1, deployment_id=None)
    c = await store.cancel(run.id)
    assert c.status == Status.RUNNING
    assert c.cancel_requested
    hb = await store.heartbeat_many("w", [run.lease, run.lease.__class__("gone", 1)])
    assert hb.renewed == (run.lease,)
    assert len(hb.lost) == 1
    assert hb.cancel_requested == (run.id,)
    assert await store.settle_cancelled("w", run.lease)
    assert len(await store.list_workers(max_age_seconds=60)) == 1


async def test_reap_rules(store: SqliteStore) -> None:
    ids = {}
    for name, kw in {
        "nonidem": {"max_attempts": 3},
        "noreq": {"max_attempts": 3, "save_request": False},
        "exhausted": {},
        "retry": {"max_attempts": 3},
    }.items():
        ids[name] = (await store.submit(new(**kw), max_queue_depth=0)).run.id
    runs = {r.id: r for r in await store.claim("w", 10, deployment_id=None)}
    assert await store.set_non_idempotent("w", runs[ids["nonidem"]].lease, True)
    assert (await store.reap_stale(lock_grace_seconds=60, limit=50)).requeued == 0
    store.clock_offset_seconds = 120
    report = await store.reap_stale(lock_grace_seconds=60, limit=50)
    assert report.requeued_ids == [ids["retry"]]
    assert sorted(report.dead_lettered_ids) == sorted(
        [ids["nonidem"], ids["noreq"], ids["exhausted"]]
    )
    ex = await store.get(ids["exhausted"])
    assert ex is not None
    assert ex.termination_reason == TerminationReason.RETRIES_EXHAUSTED
    assert ex.error is not None
    assert f"runq jobs requeue {ex.id}" in ex.error
    assert "1 of 1" in ex.error
    ni = await store.get(ids["nonidem"])
    assert ni is not None
    assert ni.termination_reason == TerminationReason.NOT_RETRYABLE


async def test_purge_stats_list_usage_reseal(store: SqliteStore, tmp_path: Path) -> None:
    for i in range(5):
        await store.submit(new(actor=Actor(user_id=f"u{i % 2}")), max_queue_depth=0)
    runs = await store.claim("w", 3, deployment_id=None)
    await store.complete_many("w", [Completion(run_id=r.id, attempt=1, answer=r.id) for r in runs])
    stats = await store.stats()
    assert stats.counts == {"completed": 3, "queued": 2}
    assert stats.oldest_queued_age_seconds is not None
    health = await store.health(lock_grace_seconds=60, worker_max_age_seconds=60)
    assert "" in health.oldest_queued_age_by_deployment
    page = await store.list_jobs(
        where=RunFilter(statuses=(Status.COMPLETED,)), limit=2, sort_by="bogus; DROP"
    )
    assert page.total_count == 3
    assert len(page.data) == 2
    assert (await store.list_jobs(where=RunFilter(user_id="u0"))).total_count == 3
    key = UsageKey("user", "u0", 0.0)
    await store.count_claimed_run([key])
    await store.record_usage("w", runs[0].lease, tokens=5, cost=0.5, keys=[key])
    totals = await store.usage_totals([key, UsageKey("user", "none", 0.0)])
    assert totals[key].runs == 1
    assert totals[key].tokens == 5
    assert totals[key].cost == 0.5
    # rotation: a new ring whose first key is new re-seals everything
    new_key = bytes(range(1, 33))
    rotated = SqliteStore(tmp_path / "q.db", schema="runq", sealer=KeyRing([new_key, KEY]))
    await rotated.connect()
    try:
        after, total = "", 0
        while True:
            last, n = await rotated.reseal_page(after_id=after, limit=2)
            total += n
            if last is None:
                break
            after = last
        assert total == 8  # 5 payloads + 3 answers
        only_new = SqliteStore(tmp_path / "q.db", schema="runq", sealer=KeyRing([new_key]))
        await only_new.connect()
        assert (await only_new.get(runs[0].id)).answer == runs[0].id  # type: ignore[union-attr]
        await only_new.close()
    finally:
        await rotated.close()
    store.clock_offset_seconds = 10_000
    report = await purge(store, retention_seconds=60, paused_retention_seconds=0, batch_size=2)
    assert report.deleted == 3
    assert report.batches == 2
    assert await store.count_runs() == 2


async def test_unavailable(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "missing" / "q.db", schema="runq", sealer=KeyRing([KEY]))
    with pytest.raises(StoreUnavailable, match="missing"):
        await s.connect()
    s2 = SqliteStore(tmp_path / "q.db", schema="runq", sealer=KeyRing([KEY]))
    with pytest.raises(StoreUnavailable):
        await s2.get("x")
    await s2.connect()
    with pytest.raises(StoreUnavailable, match="migrate"):
        await s2.get("x")
    await s2.close()


async def test_locked_maps_to_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    s = SqliteStore(path, schema="runq", sealer=KeyRing([KEY]))
    await s.connect()
    await s.migrate()
    holder = sqlite3.connect(path, isolation_level=None, timeout=0)
    holder.execute("BEGIN IMMEDIATE")
    import runq.store.sqlite.connection as mod

    old = mod.BUSY_TIMEOUT_SECONDS
    try:
        await s.close()
        mod.BUSY_TIMEOUT_SECONDS = 0.2
        s = SqliteStore(path, schema="runq", sealer=KeyRing([KEY]))
        await s.connect()
        with pytest.raises(StoreUnavailable, match="locked"):
            await s.submit(new(), max_queue_depth=0)
        assert await s.count_runs() == 0  # readers are not blocked by a writer in WAL
    finally:
        mod.BUSY_TIMEOUT_SECONDS = old
        holder.execute("ROLLBACK")
        holder.close()
        await s.close()


async def test_cancelled_claim_gives_its_runs_back(store: SqliteStore) -> None:
    import asyncio

    run = (await store.submit(new(), max_queue_depth=0)).run
    claim = asyncio.ensure_future(store.claim("w", 5, deployment_id=None))
    await asyncio.sleep(0)  # the transaction is on its way to the connection thread
    claim.cancel()
    with pytest.raises(asyncio.CancelledError):
        await claim
    back = await store.get(run.id)
    assert back is not None
    assert back.status == Status.QUEUED
    assert back.attempt == 0
    assert back.locked_by is None


async def test_a_run_that_does_not_open_is_given_back(store: SqliteStore) -> None:
    bad = (await store.submit(new(), max_queue_depth=0)).run
    good = (await store.submit(new(), max_queue_depth=0)).run
    db = sqlite3.connect(store.path)
    db.execute("UPDATE runq_runs SET payload = x'00' WHERE id = ?", (bad.id,))
    db.commit()
    db.close()
    claimed = await store.claim("w", 5, deployment_id=None)
    assert [r.id for r in claimed] == [good.id]
    raw = sqlite3.connect(store.path).execute(
        "SELECT status, attempt, error FROM runq_runs WHERE id = ?", (bad.id,)
    )
    status, attempt, error = raw.fetchone()
    assert (status, attempt) == ("queued", 0)
    assert "not executed" in error
    assert claimed.unopenable == (bad.id,)
    again = await store.claim("w", 5, deployment_id=None)
    assert (list(again), again.unopenable) == ([], (bad.id,))
