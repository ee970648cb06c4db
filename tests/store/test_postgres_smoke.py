"""Smoke tests of the PostgreSQL engine alone: what only Postgres has (pool recovery, SKIP
LOCKED under concurrency, the advisory-locked migration, NOTIFY, the claim plan) plus one
pass over every verb. The conformance suite covers the shared semantics on both engines.

The real server restart restarts a private cluster of its own (tests/pgcluster.py); the
other recovery tests kill the store's backends on the shared server.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from conftest import PG_URL, drop_schema, new_schema_name
from factories import purge
from helpers import ordered_run_id, wait_for
from pgcluster import PgClusterFactory

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
    Lease,
    NewRun,
    Status,
    TerminationReason,
    UsageKey,
    WorkerInfo,
)
from runq.seal import KeyRing
from runq.store import messages
from runq.store.migration_files import load_migrations
from runq.store.postgres import PostgresStore

KEY = bytes(range(32))


def new(**kw: Any) -> NewRun:
    base: dict[str, Any] = {
        "component_type": "task",
        "component_id": "echo",
        "payload": {"x": 1},
        "id": ordered_run_id(),
    }
    base.update(kw)
    return NewRun(**base)


def make(schema: str, **kw: Any) -> PostgresStore:
    return PostgresStore(PG_URL, schema=schema, sealer=KeyRing([KEY]), **kw)


@pytest.fixture
async def schema(pg_url: str) -> AsyncIterator[str]:
    # pg_url (a sync fixture) checks reachability before any event loop runs.
    name = new_schema_name()
    yield name
    await drop_schema(name)


@pytest.fixture
async def store(schema: str) -> AsyncIterator[PostgresStore]:
    s = make(schema, application_name=f"runq-test-{schema}")
    await s.connect()
    assert await s.migrate() == len(load_migrations("postgres"))
    try:
        yield s
    finally:
        await s.close()


async def raw(sql: str, *args: Any) -> list[asyncpg.Record]:
    con = await asyncpg.connect(PG_URL)
    try:
        return list(await con.fetch(sql, *args))
    finally:
        await con.close()


# -- lifecycle ---------------------------------------------------------------------------


async def test_identity_and_channel(store: PostgresStore, schema: str) -> None:
    assert store.engine == "postgres"
    assert store.notifications().crosses_processes is True
    assert store.clock_offset_seconds == 0.0
    assert store.schema == schema
    assert store.url == PG_URL
    assert store.channel == f"runq_{schema}"
    assert abs(await store.now() - time.time()) < 5
    store.clock_offset_seconds = 3600.0
    assert abs(await store.now() - time.time() - 3600.0) < 5


async def test_migrate_is_idempotent_and_recorded(store: PostgresStore, schema: str) -> None:
    assert await store.migrate() == 0
    assert await store.schema_is_current()
    rows = await raw(f"SELECT version, name, applied_at FROM {schema}.schema_migrations")
    expected = [(m.version, m.name) for m in load_migrations("postgres")]
    assert sorted((r["version"], r["name"]) for r in rows) == expected
    assert expected[:2] == [(1, "runs"), (2, "leaner_indexes")]
    assert abs(rows[0]["applied_at"] - time.time()) < 60


async def test_concurrent_migrate_on_a_fresh_schema(schema: str) -> None:
    stores = [make(schema) for _ in range(4)]
    for s in stores:
        await s.connect()
    try:
        assert not await stores[0].schema_is_current()
        applied = await asyncio.gather(*(s.migrate() for s in stores))
        assert sum(applied) == len(load_migrations("postgres"))  # each once, by whichever won
        assert all([await s.schema_is_current() for s in stores])
    finally:
        for s in stores:
            await s.close()


async def test_unreachable_server_is_store_unavailable_without_password(schema: str) -> None:
    s = PostgresStore(
        "postgresql://runq:hunter2@127.0.0.1:1/nope",
        schema=schema,
        sealer=KeyRing([KEY]),
        connect_timeout=2,
    )
    with pytest.raises(StoreUnavailable) as info:
        await s.connect()
    assert "hunter2" not in str(info.value)
    assert "127.0.0.1:1" in str(info.value)


async def test_a_closed_store_is_unavailable(schema: str) -> None:
    s = make(schema)
    with pytest.raises(StoreUnavailable):
        await s.ping()


async def _kill_backends(application_name: str) -> int:
    rows = await raw(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
        application_name,
    )
    return len(rows)


async def test_pool_recovers_after_its_connections_are_killed(schema: str) -> None:
    app = f"runq-kill-{secrets.token_hex(4)}"
    s = make(schema, application_name=app, min_size=3, max_size=3)
    await s.connect()
    try:
        await s.migrate()
        await s.submit(new(), max_queue_depth=0)
        assert await _kill_backends(app) >= 1
        # Reads retry once on a fresh connection.
        assert await s.count_runs() == 1
        await _kill_backends(app)
        # A write is retried only when it was never sent; one that may have reached the
        # dying backend fails once with StoreUnavailable, and the next call works.
        messages: list[str] = []
        try:
            await s.submit(new(), max_queue_depth=0)
        except StoreUnavailable as e:
            messages.append(str(e))
        assert all(PG_URL.split("@")[-1] in m for m in messages)
        await s.submit(new(), max_queue_depth=0)
        assert await s.count_runs() in (2, 3)
        claimed = await s.claim("w", 10, deployment_id=None)
        assert len(claimed) == await s.count_runs()
    finally:
        await s.close()


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_store_survives_a_server_restart(pg_clusters: PgClusterFactory, mode: str) -> None:
    cluster = await pg_clusters.start()
    store = PostgresStore(cluster.url, schema="runq", sealer=KeyRing([KEY]))
    await store.connect()
    try:
        await store.migrate()
        await store.submit(new(), max_queue_depth=0)
        await cluster.restart(mode)

        async def works() -> bool:
            try:
                await store.submit(new(), max_queue_depth=0)
            except StoreUnavailable:
                return False  # the first call after the restart may meet a dead connection
            return True

        await wait_for(works, timeout=30, interval=0.2, message="store never recovered")
        assert await store.count_runs() == 2
        await store.ping()
    finally:
        await store.close()


# -- producer ----------------------------------------------------------------------------


async def test_submit_round_trip_idempotency_and_depth(store: PostgresStore) -> None:
    actor = Actor(user_id="u1", scopes=("a",))
    first = await store.submit(new(idempotency_key="k", actor=actor), max_queue_depth=2)
    assert first.created
    assert first.run.status is Status.QUEUED
    assert first.run.attempt == 0
    assert first.run.actor == actor
    assert first.run.user_id == "u1"
    assert first.run.payload == {"x": 1}
    again = await store.submit(new(idempotency_key="k", actor=actor), max_queue_depth=2)
    assert not again.created
    assert again.run.id == first.run.id
    # Another user may use the same key.
    other = await store.submit(new(idempotency_key="k"), max_queue_depth=2)
    assert other.created
    with pytest.raises(QueueFull, match="2 runs are queued"):
        await store.submit(new(), max_queue_depth=2)
    # A duplicate is answered even when the queue is full.
    assert not (await store.submit(new(idempotency_key="k"), max_queue_depth=2)).created
    with pytest.raises(IdempotencyConflict):
        await store.submit(
            new(idempotency_key="k", component_id="other", actor=actor), max_queue_depth=0
        )
    with pytest.raises(InvalidPayload):
        await store.submit(new(payload={"x": object()}), max_queue_depth=0)
    with pytest.raises(Conflict):
        await store.submit(new(id=first.run.id), max_queue_depth=0)
    assert await store.count_runs() == 2


async def test_concurrent_submits_of_one_key_make_one_run(store: PostgresStore) -> None:
    results = await asyncio.gather(
        *(store.submit(new(idempotency_key="race"), max_queue_depth=0) for _ in range(8))
    )
    assert sum(r.created for r in results) == 1
    assert len({r.run.id for r in results}) == 1


async def test_submit_without_request_and_delay(store: PostgresStore) -> None:
    run = (await store.submit(new(save_request=False, delay_seconds=30), max_queue_depth=0)).run
    assert run.has_request is False
    assert run.payload is None
    assert run.available_at - run.created_at == pytest.approx(30, abs=0.01)
    assert await store.claim("w", 1, deployment_id=None) == []


async def test_submit_many_is_bulk_and_fast(store: PostgresStore) -> None:
    news = [new(payload={"i": i}, priority=i % 3) for i in range(20_000)]
    started = time.perf_counter()
    ids = await store.submit_many(news)
    elapsed = time.perf_counter() - started
    assert ids == [n.id for n in news]
    assert await store.count_runs() == 20_000
    assert elapsed < 10, f"submit_many of 20,000 runs took {elapsed:.1f}s"
    got = await store.get(ids[7])
    assert got is not None
    assert got.payload == {"i": 7}
    assert got.priority == 1
    assert await store.submit_many([]) == []


# -- worker ------------------------------------------------------------------------------


async def test_claim_heartbeat_complete_and_fencing(store: PostgresStore) -> None:
    await store.register_worker(WorkerInfo(id="w", hostname="h", pid=1, deployment_id=None))
    ids = await store.submit_many([new(payload=i) for i in range(3)])
    runs = await store.claim("w", 2, deployment_id=None)
    assert [r.id for r in runs] == ids[:2]
    assert all(r.status is Status.RUNNING and r.attempt == 1 and r.locked_by == "w" for r in runs)
    hb = await store.heartbeat_many("w", [r.lease for r in runs] + [Lease(ids[2], 1)])
    assert set(hb.renewed) == {r.lease for r in runs}
    assert hb.lost == (Lease(ids[2], 1),)
    await store.cancel(runs[1].id)
    hb = await store.heartbeat_many("w", [r.lease for r in runs])
    assert hb.cancel_requested == (runs[1].id,)
    done = await store.complete_many(
        "w",
        [
            Completion(run_id=runs[0].id, attempt=1, answer={"ok": True}),
            Completion(run_id=runs[1].id, attempt=2, answer="stale attempt"),
            Completion(run_id=ids[2], attempt=1, answer="never claimed"),
        ],
    )
    assert done.applied == (runs[0].id,)
    assert set(done.fenced_off) == {runs[1].id, ids[2]}
    finished = await store.get(runs[0].id)
    assert finished is not None
    assert finished.status is Status.COMPLETED
    assert finished.answer == {"ok": True}
    assert finished.locked_by is None
    assert finished.termination_reason is TerminationReason.COMPLETED
    assert await store.settle_cancelled("w", runs[1].lease)
    workers = await store.list_workers(max_age_seconds=60)
    assert [w.id for w in workers] == ["w"]
    assert workers[0].last_seen_at >= workers[0].started_at


async def test_concurrent_claimers_never_share_a_run(schema: str, store: PostgresStore) -> None:
    await store.submit_many([new() for _ in range(300)])
    others = [make(schema, max_size=4) for _ in range(3)]
    for o in others:
        await o.connect()
    try:

        async def drain(s: PostgresStore, name: str) -> list[str]:
            got: list[str] = []
            while batch := await s.claim(name, 7, deployment_id=None):
                got.extend(r.id for r in batch)
            return got

        results = await asyncio.gather(
            *(drain(s, f"w{i}") for i, s in enumerate([store, *others, store]))
        )
        claimed = [rid for r in results for rid in r]
        assert len(claimed) == 300
        assert len(set(claimed)) == 300
    finally:
        for o in others:
            await o.close()


async def test_affinity_merges_both_deployments_in_claim_order(store: PostgresStore) -> None:
    a = (await store.submit(new(priority=5), max_queue_depth=0)).run
    b = (await store.submit(new(priority=1, deployment_id="gpu"), max_queue_depth=0)).run
    c = (await store.submit(new(priority=3), max_queue_depth=0)).run
    foreign = (await store.submit(new(priority=0, deployment_id="cpu"), max_queue_depth=0)).run
    assert [r.id for r in await store.claim("w", 10, deployment_id="gpu")] == [b.id, c.id, a.id]
    assert await store.claim("w", 10, deployment_id=None) == []
    assert [r.id for r in await store.claim("w", 10, deployment_id="cpu")] == [foreign.id]


async def test_session_rule_and_budget_block(store: PostgresStore) -> None:
    s1 = (await store.submit(new(session_id="s"), max_queue_depth=0)).run
    s2 = (await store.submit(new(session_id="s"), max_queue_depth=0)).run
    blocked = (await store.submit(new(actor=Actor(user_id="poor")), max_queue_depth=0)).run
    pair = (
        await store.submit(new(actor=Actor(user_id="u"), configuration="c"), max_queue_depth=0)
    ).run
    block = BudgetBlock(users=frozenset({"poor"}), pairs=frozenset({("u", "c")}))
    got = await store.claim("w", 10, deployment_id=None, blocked=block)
    assert [r.id for r in got] == [s1.id]
    assert await store.claim("w", 10, deployment_id=None, blocked=block) == []
    assert await store.claim("w", 1, deployment_id=None, run_id=s2.id) == []
    free = await store.claim("w", 10, deployment_id=None, serialize_sessions=False)
    assert {r.id for r in free} == {s2.id, blocked.id, pair.id}


async def test_fail_retry_and_dead_letter(store: PostgresStore) -> None:
    run = (await store.submit(new(max_attempts=2), max_queue_depth=0)).run
    [claimed] = await store.claim("w", 1, deployment_id=None)
    out = await store.fail("w", claimed.lease, error="e1", retryable=True, retry_in_seconds=0)
    assert out is FailOutcome.RETRY_SCHEDULED
    assert await store.fail("w", claimed.lease, error="x", retryable=True, retry_in_seconds=0) is (
        FailOutcome.FENCED_OFF
    )
    [again] = await store.claim("w", 1, deployment_id=None)
    assert again.attempt == 2
    assert again.error == "e1"
    out = await store.fail("w", again.lease, error="e2", retryable=True, retry_in_seconds=0)
    assert out is FailOutcome.DEAD_LETTERED
    dead = await store.get(run.id)
    assert dead is not None
    assert dead.termination_reason is TerminationReason.RETRIES_EXHAUSTED
    assert dead.completed_at is not None
    assert dead.locked_by is None


async def test_pause_continue_and_requeue(store: PostgresStore) -> None:
    run = (await store.submit(new(), max_queue_depth=0)).run
    [claimed] = await store.claim("w", 1, deployment_id=None)
    assert await store.pause("w", claimed.lease, reason="approval", state={"step": 3})
    paused = await store.get(run.id)
    assert paused is not None
    assert paused.status is Status.PAUSED
    assert paused.resume is not None
    assert paused.resume.state == {"step": 3}
    continued = await store.continue_(run.id, {"ok": True})
    assert continued.status is Status.QUEUED
    assert continued.max_attempts == 2
    assert continued.resume is not None
    assert continued.resume.decision == {"ok": True}
    assert (await store.continue_(run.id, {"ok": False})).resume == continued.resume
    with pytest.raises(NotFound):
        await store.continue_("nope", None)
    with pytest.raises(InvalidTransition):
        await store.requeue(run.id, clear_cancellation=False, force=False, lock_grace_seconds=60)
    cancelled = await store.cancel(run.id)
    assert cancelled.status is Status.CANCELLED
    assert cancelled.resume is None
    with pytest.raises(Conflict):
        await store.continue_(run.id, None)
    again = await store.requeue(
        run.id, clear_cancellation=False, force=False, lock_grace_seconds=60
    )
    assert again.status is Status.QUEUED
    assert again.cancel_requested is True


# -- maintenance -------------------------------------------------------------------------


async def test_reaper_rules_and_a_locked_row_is_skipped(store: PostgresStore, schema: str) -> None:
    ids = await store.submit_many(
        [new(max_attempts=2), new(), new(save_request=False, max_attempts=3), new(max_attempts=3)]
    )
    claimed = {r.id: r for r in await store.claim("w", 4, deployment_id=None)}
    assert await store.set_non_idempotent("w", claimed[ids[3]].lease, True)
    store.clock_offset_seconds = 120
    con = await asyncpg.connect(PG_URL)
    try:
        # Another transaction holds the first run (a heartbeat in flight, say): skipped.
        tr = con.transaction()
        await tr.start()
        await con.execute(f"SELECT 1 FROM {schema}.runs WHERE id = $1 FOR UPDATE", ids[0])
        report = await store.reap_stale(lock_grace_seconds=60, limit=50)
        await tr.rollback()
    finally:
        await con.close()
    assert report.skipped == 1
    assert report.requeued == 0
    assert report.dead_lettered_ids == sorted(ids[1:])
    runs = {rid: await store.get(rid) for rid in ids[1:]}
    assert runs[ids[1]].error == messages.reap_exhausted_error(ids[1], 1, 1)  # type: ignore[union-attr]
    assert runs[ids[2]].error == messages.REAP_NO_REQUEST_ERROR  # type: ignore[union-attr]
    assert runs[ids[3]].error == messages.REAP_NON_IDEMPOTENT_ERROR  # type: ignore[union-attr]
    report = await store.reap_stale(lock_grace_seconds=60, limit=50)
    assert report.requeued_ids == [ids[0]]
    assert report.skipped == 0


async def test_purge_in_batches(store: PostgresStore) -> None:
    await store.submit_many([new() for _ in range(25)])
    runs = await store.claim("w", 25, deployment_id=None)
    await store.complete_many("w", [Completion(run_id=r.id, attempt=1) for r in runs])
    await store.submit(new(), max_queue_depth=0)
    report = await purge(store, retention_seconds=-10, paused_retention_seconds=0, batch_size=10)
    assert (report.deleted, report.batches) == (25, 3)
    assert await store.count_runs() == 1


async def test_usage_counters(store: PostgresStore) -> None:
    run = (await store.submit(new(), max_queue_depth=0)).run
    keys = [UsageKey("user", "u", 1000.0), UsageKey("configuration", "c", 1000.0)]
    await store.count_claimed_run(keys)
    await store.record_usage("w", run.lease, tokens=10, cost=0.5, keys=keys)
    await store.record_usage("w", run.lease, tokens=5, cost=0.25, keys=keys[:1])
    totals = await store.usage_totals([*keys, UsageKey("user", "x", 1000.0)])
    assert (totals[keys[0]].tokens, totals[keys[0]].cost, totals[keys[0]].runs) == (15, 0.75, 1)
    assert totals[UsageKey("user", "x", 1000.0)].runs == 0
    periods = await store.usage_in_periods([("user", 1000.0)])
    assert set(periods) == {keys[0]}
    got = await store.get(run.id)
    assert got is not None
    assert (got.tokens, got.cost) == (15, 0.75)


async def test_stats_health_listing_and_reseal(store: PostgresStore) -> None:
    await store.submit_many([new(deployment_id="gpu"), new(), new(actor=Actor(user_id="u"))])
    store.clock_offset_seconds = 10
    stats = await store.stats()
    assert stats.counts == {"queued": 3}
    assert stats.oldest_queued_age_seconds == pytest.approx(10, abs=2)
    health = await store.health(lock_grace_seconds=60, worker_max_age_seconds=60)
    assert set(health.oldest_queued_age_by_deployment) == {"", "gpu"}
    page = await store.list_jobs(limit=2, sort_by="created_at; DROP TABLE x", sort_order="asc")
    assert page.total_count == 3
    assert len(page.data) == 2
    assert (await store.list_jobs(where=RunFilter(user_id="u"))).total_count == 1
    assert (await store.list_jobs(where=RunFilter(statuses=(Status.FAILED,)))).total_count == 0
    rotated = PostgresStore(PG_URL, schema=store.schema, sealer=KeyRing([bytes(32), KEY]))
    await rotated.connect()
    try:
        last, count = await rotated.reseal_page(after_id="", limit=100)
        assert count == 3
        assert last is not None
        assert await rotated.reseal_page(after_id=last, limit=100) == (None, 0)
        assert (await rotated.list_jobs()).total_count == 3
    finally:
        await rotated.close()


async def test_notify_reaches_a_listener(store: PostgresStore) -> None:
    got: asyncio.Queue[str] = asyncio.Queue()
    con = await asyncpg.connect(PG_URL)
    try:
        await con.add_listener(store.channel, lambda *a: got.put_nowait(a[-1]))
        await store.notify("wake")
        assert await asyncio.wait_for(got.get(), timeout=5) == "wake"
    finally:
        await con.close()


async def test_claim_walks_the_partial_index(store: PostgresStore, schema: str) -> None:
    await store.submit_many([new() for _ in range(50)])
    con = await asyncpg.connect(PG_URL)
    try:
        await con.execute(f"ANALYZE {schema}.runs")
        plan = "\n".join(
            r[0]
            for r in await con.fetch(
                "EXPLAIN " + store.statements.claim_affinity, "w", 4, True, [], [], [], [], "gpu"
            )
        )
    finally:
        await con.close()
    # One ordered walk of the partial index per deployment id ('' and 'gpu').
    assert plan.count("Index Scan using runs_claim_idx") == 2, plan


async def test_submit_can_carry_its_wake_up_notify(store: PostgresStore) -> None:
    conn = await asyncpg.connect(PG_URL)
    heard: list[str] = []
    try:
        await conn.add_listener(store.channel, lambda *args: heard.append(args[3]))
        await store.submit(new(idempotency_key="k-wake"), max_queue_depth=0, wake=True)
        await wait_for(lambda: heard == ["wake"], timeout=5, message="the NOTIFY arrives")
        # A duplicate inserts nothing, so it announces nothing; wake=False never does.
        await store.submit(new(idempotency_key="k-wake"), max_queue_depth=0, wake=True)
        await store.submit(new(), max_queue_depth=0)
        await conn.execute("SELECT pg_notify($1, 'marker')", store.channel)
        await wait_for(lambda: heard[-1:] == ["marker"], timeout=5, message="marker arrives")
        assert heard == ["wake", "marker"]
    finally:
        await conn.close()
