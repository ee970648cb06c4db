"""The store conformance suite: every verb and rule of ``runq/store/base.py``, the state
machine of ``runq.model.TRANSITIONS``, the reaper's rules and the operator verbs, run once
per engine (the ``store`` fixture is parametrised over SQLite and PostgreSQL). An engine
is done when this file passes on it.

Times come from the database clock; tests move it with ``store.clock_offset_seconds``
instead of sleeping. Order-sensitive tests submit runs with strictly increasing ids
(the factory's default) so "oldest first" never depends on a shared millisecond.
"""

from __future__ import annotations

import itertools
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    PG_URL,
    TEST_KEY,
    drop_schema,
    new_schema_name,
    require_postgres,
)
from factories import (
    StoreHandle,
    claim_one,
    engine_ready,
    handle,
    make_run,
    new_run,
    purge,
    shifted_clock,
    stale_lease,
    submit,
)
from helpers import gather, ordered_run_id

import runq.store
from runq.errors import (
    BadRequest,
    Conflict,
    IdempotencyConflict,
    InvalidPayload,
    InvalidTransition,
    NotFound,
    QueueFull,
    SealError,
    StoreUnavailable,
)
from runq.ids import new_run_id, new_run_ids
from runq.listing import RunFilter
from runq.model import (
    Actor,
    BudgetBlock,
    Completion,
    FailOutcome,
    Lease,
    Resume,
    Run,
    Status,
    TerminationReason,
    UsageKey,
    UsageTotals,
    WorkerInfo,
)
from runq.seal import KeyRing, key_id_of, sealed_key_id
from runq.store import make_store
from runq.store.base import Store

#: Marked here (not only by conftest's late hook) so anyio sees the marker at collection and
#: keeps the engine parametrisation of each item.
pytestmark = pytest.mark.anyio

__all__ = ["engine_ready", "handle"]  # fixtures used by name

GRACE = 60.0
DAY = 86400.0
#: Slack for comparing database timestamps taken a few statements apart.
CLOCK_SLACK = 2.0


@pytest.fixture
def store(handle: StoreHandle) -> Store:
    """The conftest ``store``, but built through ``handle`` so tests can also see raw rows."""
    return handle.store


async def claim(
    store: Store,
    worker: str = "w1",
    slots: int = 10,
    *,
    deployment_id: str | None = None,
    **kw: Any,
) -> list[Run]:
    return await store.claim(worker, slots, deployment_id=deployment_id, **kw)


def ids(runs: list[Run]) -> set[str]:
    return {r.id for r in runs}


async def get(store: Store, run_id: str) -> Run:
    run = await store.get(run_id)
    assert run is not None, f"run {run_id} is missing"
    return run


def fresh_location(engine: str, tmp_path: Path, filename: str) -> tuple[str, str]:
    """(url, schema) of an empty, unmigrated database for ``engine``."""
    if engine == "postgres":
        require_postgres()
        return PG_URL, new_schema_name()
    return f"sqlite:///{tmp_path / filename}", "runq"


def migration_count(engine: str) -> int:
    folder = Path(runq.store.__file__).parent / "migrations" / engine
    return len(list(folder.glob("[0-9][0-9][0-9][0-9]_*.sql")))


# =========================================================================================
# lifecycle
# =========================================================================================


async def test_engine_identity_and_capabilities(handle: StoreHandle) -> None:
    store = handle.store
    assert isinstance(store, Store)
    assert store.engine == handle.engine
    assert store.notifications().crosses_processes is (handle.engine == "postgres")
    assert store.clock_offset_seconds == 0.0


async def test_migrate_twice_is_a_noop(store: Store) -> None:
    await submit(store)
    assert await store.migrate() == 0
    assert await store.schema_is_current() is True
    assert await store.count_runs() == 1


async def test_fresh_database_is_not_current_until_migrated(
    engine_ready: str, tmp_path: Path, key_ring: KeyRing
) -> None:
    engine = engine_ready
    url, schema = fresh_location(engine, tmp_path, "fresh.db")
    store = make_store(url, schema=schema, sealer=key_ring)
    await store.connect()
    try:
        assert await store.schema_is_current() is False
        assert await store.migrate() == migration_count(engine)
        assert await store.schema_is_current() is True
        assert await store.migrate() == 0
    finally:
        await store.close()
        if engine == "postgres":
            await drop_schema(schema)


async def test_concurrent_migrate_on_a_fresh_database_is_safe(
    engine_ready: str, tmp_path: Path, key_ring: KeyRing
) -> None:
    engine = engine_ready
    url, schema = fresh_location(engine, tmp_path, "race.db")
    stores = [make_store(url, schema=schema, sealer=key_ring) for _ in range(4)]
    try:
        for s in stores:
            await s.connect()
        applied = await gather(*(s.migrate() for s in stores))
        assert sum(applied) == migration_count(engine), applied
        for s in stores:
            assert await s.schema_is_current() is True
        await submit(stores[0])
        assert await stores[3].count_runs() == 1
    finally:
        for s in stores:
            await s.close()
        if engine == "postgres":
            await drop_schema(schema)


async def test_ping_and_count_runs(store: Store) -> None:
    await store.ping()
    assert await store.count_runs() == 0
    await submit(store)
    await submit(store)
    assert await store.count_runs() == 2


async def test_now_is_the_database_clock_plus_offset(store: Store) -> None:
    t0 = await store.now()
    assert abs(t0 - time.time()) < 5, "the database clock of a local test database is near ours"
    store.clock_offset_seconds = 1000.0
    t1 = await store.now()
    assert 1000 - 1 <= t1 - t0 <= 1000 + 5
    store.clock_offset_seconds = -50.0
    t2 = await store.now()
    assert -51 <= t2 - t0 <= -50 + 5


@pytest.mark.timeout(60)
async def test_unreachable_postgres_raises_store_unavailable_without_password(
    key_ring: KeyRing,
) -> None:
    s = make_store(
        "postgresql://postgres:s3cretpw@127.0.0.1:1/test", schema="runq", sealer=key_ring
    )
    with pytest.raises(StoreUnavailable) as excinfo:
        await s.connect()
    message = str(excinfo.value)
    assert "s3cretpw" not in message
    assert "127.0.0.1" in message


async def test_unopenable_sqlite_raises_store_unavailable(
    tmp_path: Path, key_ring: KeyRing
) -> None:
    # The path is a directory: no database can be opened there.
    s = make_store(f"sqlite:///{tmp_path}", schema="runq", sealer=key_ring)

    async def open_and_migrate() -> None:
        await s.connect()
        await s.migrate()

    with pytest.raises(StoreUnavailable):
        await open_and_migrate()
    await s.close()


def test_run_ids_sort_in_creation_order() -> None:
    """Claims break ties and the session rule picks "the oldest" by id (INTERNALS: "id order
    is creation order"), so ids made back to back must sort in the order they were made."""
    made = [new_run_id() for _ in range(2000)]
    assert len(set(made)) == len(made)
    out_of_order = sum(1 for a, b in itertools.pairwise(made) if a > b)
    assert out_of_order == 0, f"{out_of_order} of {len(made)} consecutive ids sort backwards"


def test_ids_made_in_bulk_sort_after_single_ones_and_are_uuid7() -> None:
    """A bulk submit makes its ids in one go (``new_run_ids``): still unique, increasing,
    after every id made before and before every id made after, each a valid UUIDv7."""
    before = new_run_id()
    made = new_run_ids(5000)
    after = new_run_id()
    assert len(set(made)) == len(made)
    assert [before, *made, after] == sorted([before, *made, after])
    assert all(a < b for a, b in itertools.pairwise([before, *made, after]))
    for text in (made[0], made[2500], made[-1]):
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
    assert new_run_ids(0) == []


# =========================================================================================
# submit
# =========================================================================================


async def test_submit_stores_every_field(store: Store) -> None:
    actor = Actor(user_id="u-1", service_account=False, scopes=("runq:approve", "x"))
    payload = {"text": "héllo ✓", "n": [1, 2.5, None, True], "nested": {"a": {"b": "c"}}}
    before = await store.now()
    result = await store.submit(
        new_run(
            component_type="agent",
            component_id="summarize",
            payload=payload,
            session_id="s-1",
            actor=actor,
            configuration="cfg-a",
            idempotency_key="key-1",
            max_attempts=3,
            deployment_id="gpu",
            priority=-2,
            origin="http",
        ),
        max_queue_depth=0,
    )
    after = await store.now()
    run = result.run
    assert result.created is True
    assert run.status is Status.QUEUED
    assert (run.component_type, run.component_id) == ("agent", "summarize")
    assert run.component == "agent/summarize"
    assert run.payload == payload
    assert run.session_id == "s-1"
    assert run.user_id == "u-1"
    assert run.actor == actor
    assert run.configuration == "cfg-a"
    assert run.idempotency_key == "key-1"
    assert run.attempt == 0
    assert run.max_attempts == 3
    assert run.deployment_id == "gpu"
    assert run.priority == -2
    assert run.origin == "http"
    assert before - 0.01 <= run.created_at <= after + 0.01
    assert run.updated_at == pytest.approx(run.created_at, abs=0.5)
    assert run.available_at == pytest.approx(run.created_at, abs=0.5)
    assert run.started_at is None
    assert run.completed_at is None
    assert run.locked_by is None
    assert run.locked_at is None
    assert run.error is None
    assert run.termination_reason is None
    assert run.pause_reason is None
    assert run.cancel_requested is False
    assert run.non_idempotent is False
    assert run.has_request is True
    assert run.answer is None
    assert run.resume is None
    assert (run.tokens, run.cost) == (0, 0.0)
    assert await store.get(run.id) == run


async def test_submit_without_id_generates_a_uuid7(store: Store) -> None:
    import uuid

    run = await submit(store, id=None)
    assert uuid.UUID(run.id).version == 7
    assert str(uuid.UUID(run.id)) == run.id
    other = await submit(store, id=None)
    assert other.id != run.id


async def test_submit_keeps_a_given_id(store: Store) -> None:
    rid = ordered_run_id()
    run = await submit(store, id=rid)
    assert run.id == rid
    assert (await get(store, rid)).id == rid


async def test_get_unknown_is_none(store: Store) -> None:
    assert await store.get(ordered_run_id()) is None


async def test_no_deployment_is_empty_string_in_db_and_none_in_model(
    handle: StoreHandle,
) -> None:
    run = await submit(handle.store, deployment_id=None)
    assert run.deployment_id is None
    assert (await get(handle.store, run.id)).deployment_id is None
    assert (await handle.raw_row(run.id))["deployment_id"] == ""


async def test_save_request_false_keeps_no_payload(handle: StoreHandle) -> None:
    run = await submit(handle.store, payload={"secret": 1}, save_request=False)
    assert run.has_request is False
    assert run.payload is None
    got = await get(handle.store, run.id)
    assert (got.has_request, got.payload) == (False, None)
    assert (await handle.raw_row(run.id))["payload"] is None


async def test_payload_none_is_a_saved_request(store: Store) -> None:
    run = await submit(store, payload=None)
    got = await get(store, run.id)
    assert got.has_request is True
    assert got.payload is None


@pytest.mark.parametrize(
    "payload",
    [{"x": object()}, [1, complex(1, 2)], {"call": print}],
    ids=["object", "complex", "function"],
)
async def test_invalid_payload_stores_nothing(store: Store, payload: Any) -> None:
    with pytest.raises(InvalidPayload):
        await store.submit(new_run(payload=payload, idempotency_key="k"), max_queue_depth=0)
    assert await store.count_runs() == 0
    # The key was not consumed by the refused submission.
    result = await store.submit(new_run(payload={"ok": 1}, idempotency_key="k"), max_queue_depth=0)
    assert result.created is True
    assert issubclass(InvalidPayload, BadRequest)


async def test_submit_many_with_an_invalid_payload_stores_nothing(store: Store) -> None:
    with pytest.raises(InvalidPayload):
        await store.submit_many([new_run(payload={"ok": 1}), new_run(payload={"x": object()})])
    assert await store.count_runs() == 0


# -- idempotency ------------------------------------------------------------------------


async def test_same_key_same_user_returns_the_same_run(store: Store) -> None:
    first = await store.submit(new_run(idempotency_key="k1", user_id="u1"), max_queue_depth=0)
    again = await store.submit(
        new_run(idempotency_key="k1", user_id="u1", payload={"different": True}),
        max_queue_depth=0,
    )
    assert first.created is True
    assert again.created is False
    assert again.run.id == first.run.id
    assert again.run.payload == first.run.payload
    assert await store.count_runs() == 1


async def test_same_key_without_user_is_deduplicated(store: Store) -> None:
    first = await store.submit(new_run(idempotency_key="k1"), max_queue_depth=0)
    again = await store.submit(new_run(idempotency_key="k1"), max_queue_depth=0)
    assert (again.created, again.run.id) == (False, first.run.id)


async def test_same_key_other_user_is_a_new_run(store: Store) -> None:
    a = await store.submit(new_run(idempotency_key="k1", user_id="u1"), max_queue_depth=0)
    b = await store.submit(new_run(idempotency_key="k1", user_id="u2"), max_queue_depth=0)
    c = await store.submit(new_run(idempotency_key="k1"), max_queue_depth=0)
    assert (a.created, b.created, c.created) == (True, True, True)
    assert len({a.run.id, b.run.id, c.run.id}) == 3
    assert await store.count_runs() == 3


async def test_same_key_other_component_is_an_idempotency_conflict(store: Store) -> None:
    await store.submit(new_run(idempotency_key="k1", user_id="u1"), max_queue_depth=0)
    with pytest.raises(IdempotencyConflict):
        await store.submit(
            new_run(idempotency_key="k1", user_id="u1", component_id="other"),
            max_queue_depth=0,
        )
    with pytest.raises(IdempotencyConflict):
        await store.submit(
            new_run(idempotency_key="k1", user_id="u1", component_type="agent"),
            max_queue_depth=0,
        )
    assert issubclass(IdempotencyConflict, Conflict)
    assert await store.count_runs() == 1


async def test_duplicate_is_answered_even_when_the_queue_is_full(store: Store) -> None:
    first = await store.submit(new_run(idempotency_key="k1", user_id="u1"), max_queue_depth=1)
    again = await store.submit(new_run(idempotency_key="k1", user_id="u1"), max_queue_depth=1)
    assert (again.created, again.run.id) == (False, first.run.id)
    with pytest.raises(QueueFull):
        await store.submit(new_run(idempotency_key="k2", user_id="u1"), max_queue_depth=1)


async def test_key_stays_used_after_the_run_finished(store: Store) -> None:
    done = await make_run(store, Status.COMPLETED, idempotency_key="k1", user_id="u1")
    again = await store.submit(new_run(idempotency_key="k1", user_id="u1"), max_queue_depth=0)
    assert (again.created, again.run.id, again.run.status) == (False, done.id, Status.COMPLETED)


# -- depth gate -------------------------------------------------------------------------


async def test_queue_full_at_max_queue_depth(store: Store) -> None:
    for _ in range(3):
        await store.submit(new_run(), max_queue_depth=3)
    with pytest.raises(QueueFull):
        await store.submit(new_run(), max_queue_depth=3)
    assert await store.count_runs() == 3
    # Only queued runs count: claiming one makes room for exactly one more.
    assert len(await claim(store, slots=1)) == 1
    await store.submit(new_run(), max_queue_depth=3)
    with pytest.raises(QueueFull):
        await store.submit(new_run(), max_queue_depth=3)


async def test_delayed_runs_have_their_own_bound(store: Store) -> None:
    # Delayed runs never fill the due queue; they are gated by max_delayed instead.
    await store.submit(new_run(delay_seconds=100), max_queue_depth=1, max_delayed=1)
    await store.submit(new_run(), max_queue_depth=1, max_delayed=1)
    with pytest.raises(QueueFull):
        await store.submit(new_run(), max_queue_depth=1)
    with pytest.raises(QueueFull):
        await store.submit(new_run(delay_seconds=100), max_queue_depth=1, max_delayed=1)


async def test_queued_runs_per_user_are_bounded(store: Store) -> None:
    await store.submit(new_run(user_id="u"), max_queue_depth=0, max_queued_per_user=1)
    with pytest.raises(QueueFull):
        await store.submit(new_run(user_id="u"), max_queue_depth=0, max_queued_per_user=1)
    await store.submit(new_run(user_id="v"), max_queue_depth=0, max_queued_per_user=1)


async def test_depth_zero_is_unbounded(store: Store) -> None:
    for _ in range(5):
        await store.submit(new_run(), max_queue_depth=0)
    assert await store.count_runs() == 5


# -- bulk -------------------------------------------------------------------------------


async def test_submit_many_inserts_queued_runs_in_order(store: Store) -> None:
    news = [new_run(payload={"i": i}, priority=i % 3, user_id=f"u{i}") for i in range(50)]
    got_ids = await store.submit_many(news)
    assert got_ids == [n.id for n in news]
    assert await store.count_runs() == 50
    for i, rid in enumerate(got_ids):
        run = await get(store, rid)
        assert run.status is Status.QUEUED
        assert run.attempt == 0
        assert run.payload == {"i": i}
        assert run.priority == i % 3
        assert run.user_id == f"u{i}"
    assert await store.submit_many([]) == []


async def test_submit_many_generates_ids_when_none_given(store: Store) -> None:
    got_ids = await store.submit_many([new_run(id=None) for _ in range(10)])
    assert len(set(got_ids)) == 10
    assert await store.count_runs() == 10


# =========================================================================================
# claim
# =========================================================================================


async def test_claim_takes_a_lease_and_increments_attempt(store: Store) -> None:
    run = await submit(store, payload={"p": 1}, max_attempts=2)
    before = await store.now()
    [claimed] = await claim(store, "w1", 5)
    after = await store.now()
    assert claimed.id == run.id
    assert claimed.status is Status.RUNNING
    assert claimed.attempt == 1
    assert claimed.locked_by == "w1"
    assert claimed.locked_at is not None
    assert before - 0.01 <= claimed.locked_at <= after + 0.01
    assert claimed.started_at == claimed.locked_at
    assert claimed.payload == {"p": 1}
    assert claimed.lease == Lease(run.id, 1)
    assert await get(store, run.id) == claimed


async def test_claim_respects_slots(store: Store) -> None:
    for _ in range(5):
        await submit(store)
    first = await claim(store, slots=3)
    second = await claim(store, slots=3)
    assert (len(first), len(second)) == (3, 2)
    assert not ids(first) & ids(second)
    assert await claim(store, slots=3) == []


async def test_claim_orders_by_priority_then_available_at_then_id(store: Store) -> None:
    a = await submit(store, priority=5)
    b = await submit(store, priority=0)
    c = await submit(store, priority=0)
    d = await submit(store, priority=-1)
    order = [(await claim(store, slots=1))[0].id for _ in range(4)]
    assert order == [d.id, b.id, c.id, a.id]


async def test_claim_orders_by_available_at_before_id(store: Store) -> None:
    # x is older by id but became claimable later than y.
    x = await submit(store, delay_seconds=5)
    y = await submit(store)
    store.clock_offset_seconds = 10
    order = [(await claim(store, slots=1))[0].id for _ in range(2)]
    assert order == [y.id, x.id]


async def test_claim_with_slots_picks_the_best_runs(store: Store) -> None:
    low = [await submit(store, priority=9) for _ in range(3)]
    high = [await submit(store, priority=1) for _ in range(2)]
    assert ids(await claim(store, slots=2)) == {r.id for r in high}
    assert ids(await claim(store, slots=10)) == {r.id for r in low}


async def test_delayed_run_is_not_claimable_until_available_at(store: Store) -> None:
    run = await submit(store, delay_seconds=30)
    assert run.available_at == pytest.approx(run.created_at + 30, abs=0.5)
    assert await claim(store) == []
    assert await claim(store, run_id=run.id) == []
    store.clock_offset_seconds = 25
    assert await claim(store) == []
    store.clock_offset_seconds = 31
    assert ids(await claim(store)) == {run.id}


async def test_claim_skips_runs_that_are_not_queued(store: Store) -> None:
    await make_run(store, Status.RUNNING)
    await make_run(store, Status.COMPLETED)
    await make_run(store, Status.FAILED)
    await make_run(store, Status.CANCELLED)
    await make_run(store, Status.PAUSED)
    assert await claim(store, "w2", 10) == []


# -- affinity ---------------------------------------------------------------------------


async def test_worker_without_deployment_never_claims_a_deployed_run(store: Store) -> None:
    deployed = await submit(store, deployment_id="gpu-pool")
    assert await claim(store, deployment_id=None) == []
    assert await claim(store, deployment_id="cpu-pool") == []
    assert await claim(store, run_id=deployed.id, deployment_id=None) == []
    [got] = await claim(store, deployment_id="gpu-pool")
    assert got.id == deployed.id
    assert got.deployment_id == "gpu-pool"


async def test_deployed_worker_claims_both_its_own_and_undeployed_runs(store: Store) -> None:
    plain = await submit(store)
    mine = await submit(store, deployment_id="gpu-pool")
    other = await submit(store, deployment_id="tpu-pool")
    assert ids(await claim(store, deployment_id="gpu-pool")) == {plain.id, mine.id}
    assert ids(await claim(store, deployment_id="tpu-pool")) == {other.id}


# -- sessions ---------------------------------------------------------------------------


async def test_session_runs_one_at_a_time_oldest_first(store: Store) -> None:
    a = await submit(store, session_id="s1")
    b = await submit(store, session_id="s1")
    c = await submit(store, session_id="s1")
    loose = await submit(store)
    assert ids(await claim(store, slots=10)) == {a.id, loose.id}
    assert await claim(store, slots=10) == [], "a running run holds its session's line"
    done = await store.complete_many("w1", [Completion(run_id=a.id, attempt=1)])
    assert done.applied == (a.id,)
    assert ids(await claim(store, slots=10)) == {b.id}
    assert await claim(store, slots=10) == []
    await store.complete_many("w1", [Completion(run_id=b.id, attempt=1)])
    assert ids(await claim(store, slots=10)) == {c.id}


async def test_paused_run_holds_its_sessions_line(store: Store) -> None:
    a = await submit(store, session_id="s1")
    b = await submit(store, session_id="s1")
    [ra] = await claim(store, slots=10)
    assert await store.pause("w1", ra.lease, reason="approval", state={"s": 1}) is True
    assert await claim(store, slots=10) == [], "a paused run holds its session's line"
    assert await claim(store, slots=10, run_id=b.id) == []
    await store.continue_(a.id, {"ok": True})
    [again] = await claim(store, slots=10)
    assert again.id == a.id, "the continuation runs before the younger run"
    await store.complete_many("w1", [Completion(run_id=a.id, attempt=again.attempt)])
    assert ids(await claim(store, slots=10)) == {b.id}


async def test_delayed_session_head_blocks_younger_runs(store: Store) -> None:
    await submit(store, session_id="s1", delay_seconds=100)
    b = await submit(store, session_id="s1")
    assert await claim(store, slots=10) == [], "only the oldest non-final run may run"
    assert await claim(store, slots=10, run_id=b.id) == []


async def test_retry_scheduled_head_keeps_the_line(store: Store) -> None:
    a = await submit(store, session_id="s1", max_attempts=2)
    await submit(store, session_id="s1")
    [ra] = await claim(store)
    outcome = await store.fail("w1", ra.lease, error="boom", retryable=True, retry_in_seconds=50)
    assert outcome is FailOutcome.RETRY_SCHEDULED
    assert await claim(store) == [], "a queued retry is still the session's oldest non-final run"
    store.clock_offset_seconds = 51
    assert ids(await claim(store)) == {a.id}


async def test_final_runs_release_the_line(store: Store) -> None:
    await make_run(store, Status.FAILED, session_id="s1")
    await make_run(store, Status.CANCELLED, session_id="s1")
    await make_run(store, Status.COMPLETED, session_id="s1")
    d = await submit(store, session_id="s1")
    assert ids(await claim(store)) == {d.id}


async def test_cancelled_queued_head_releases_the_line(store: Store) -> None:
    a = await submit(store, session_id="s1")
    b = await submit(store, session_id="s1")
    await store.cancel(a.id)
    assert ids(await claim(store)) == {b.id}


async def test_sessions_are_independent(store: Store) -> None:
    a1 = await submit(store, session_id="s1")
    await submit(store, session_id="s1")
    b1 = await submit(store, session_id="s2")
    await submit(store, session_id="s2")
    assert ids(await claim(store, slots=10)) == {a1.id, b1.id}


async def test_serialize_sessions_false_disables_the_session_rule(store: Store) -> None:
    runs = [await submit(store, session_id="s1") for _ in range(3)]
    got = await claim(store, slots=10, serialize_sessions=False)
    assert ids(got) == {r.id for r in runs}


async def test_claim_by_id_obeys_the_session_rule(store: Store) -> None:
    a = await submit(store, session_id="s1")
    b = await submit(store, session_id="s1")
    assert await claim(store, run_id=b.id) == []
    assert ids(await claim(store, run_id=a.id)) == {a.id}
    assert ids(await claim(store, run_id=b.id, serialize_sessions=False)) == {b.id}


# -- budget -----------------------------------------------------------------------------


async def test_budget_block_excludes_users(store: Store) -> None:
    u1 = await submit(store, user_id="u1", configuration="c1")
    u2 = await submit(store, user_id="u2", configuration="c1")
    got = await claim(store, blocked=BudgetBlock(users=frozenset({"u1"})))
    assert ids(got) == {u2.id}
    assert (await get(store, u1.id)).status is Status.QUEUED


async def test_budget_block_excludes_configurations(store: Store) -> None:
    await submit(store, user_id="u1", configuration="c1")
    c2 = await submit(store, user_id="u1", configuration="c2")
    none = await submit(store, user_id="u1", configuration=None)
    got = await claim(store, blocked=BudgetBlock(configurations=frozenset({"c1"})))
    assert ids(got) == {c2.id, none.id}


async def test_budget_block_excludes_pairs_only(store: Store) -> None:
    await submit(store, user_id="u1", configuration="c2")
    u1c1 = await submit(store, user_id="u1", configuration="c1")
    u2c2 = await submit(store, user_id="u2", configuration="c2")
    got = await claim(store, blocked=BudgetBlock(pairs=frozenset({("u1", "c2")})))
    assert ids(got) == {u1c1.id, u2c2.id}


async def test_budget_block_matches_none_as_empty_string(store: Store) -> None:
    await submit(store, user_id=None, configuration="c1")
    await submit(store, user_id="u1", configuration=None)
    ok = await submit(store, user_id="u1", configuration="c1")
    blocked = BudgetBlock(pairs=frozenset({("", "c1"), ("u1", "")}))
    assert ids(await claim(store, blocked=blocked)) == {ok.id}


async def test_budget_block_applies_to_claim_by_id(store: Store) -> None:
    run = await submit(store, user_id="u1")
    assert await claim(store, run_id=run.id, blocked=BudgetBlock(users=frozenset({"u1"}))) == []
    assert ids(await claim(store, run_id=run.id, blocked=BudgetBlock())) == {run.id}


async def test_blocked_runs_do_not_hold_back_the_runs_behind_them(store: Store) -> None:
    await submit(store, user_id="broke", priority=-5)
    later = await submit(store, user_id="rich", priority=5)
    got = await claim(store, slots=1, blocked=BudgetBlock(users=frozenset({"broke"})))
    assert ids(got) == {later.id}


# -- claim by id ------------------------------------------------------------------------


async def test_claim_by_id_claims_only_that_run(store: Store) -> None:
    await submit(store, priority=-10)
    target = await submit(store, priority=10)
    got = await claim(store, slots=5, run_id=target.id)
    assert ids(got) == {target.id}
    assert got[0].attempt == 1
    assert await claim(store, run_id=target.id) == [], "already running"
    assert await claim(store, run_id=ordered_run_id()) == []


# -- concurrency ------------------------------------------------------------------------


async def test_concurrent_claims_never_share_a_run(handle: StoreHandle, key_ring: KeyRing) -> None:
    store = handle.store
    await store.submit_many([new_run() for _ in range(60)])
    other = await handle.open_another(key_ring)
    results = await gather(
        *((store if i % 2 else other).claim(f"w{i}", 7, deployment_id=None) for i in range(12))
    )
    claimed = [r.id for batch in results for r in batch]
    assert len(claimed) == len(set(claimed)), "a run was claimed twice"
    assert len(claimed) == 60
    for i, batch in enumerate(results):
        assert all(r.locked_by == f"w{i}" for r in batch)


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


# =========================================================================================
# stats and health
# =========================================================================================


async def test_stats_counts_every_status(store: Store) -> None:
    await make_run(store, Status.QUEUED)
    await make_run(store, Status.QUEUED)
    await make_run(store, Status.RUNNING)
    await make_run(store, Status.COMPLETED)
    await make_run(store, Status.COMPLETED)
    await make_run(store, Status.COMPLETED)
    await make_run(store, Status.FAILED)
    await make_run(store, Status.CANCELLED)
    await make_run(store, Status.PAUSED)
    stats = await store.stats()
    expected = {"queued": 2, "running": 1, "completed": 3, "failed": 1, "cancelled": 1, "paused": 1}
    assert {k: v for k, v in stats.counts.items() if v} == expected


async def test_stats_of_an_empty_queue(store: Store) -> None:
    stats = await store.stats()
    assert all(v == 0 for v in stats.counts.values())
    assert stats.oldest_queued_age_seconds is None


async def test_oldest_queued_age_is_measured_from_available_at(store: Store) -> None:
    await submit(store, delay_seconds=1000)  # created first, claimable much later
    store.clock_offset_seconds = 50
    await submit(store)
    store.clock_offset_seconds = 60
    stats = await store.stats()
    assert stats.oldest_queued_age_seconds == pytest.approx(10, abs=CLOCK_SLACK)


async def test_a_delayed_run_is_not_counted_as_waiting(store: Store) -> None:
    await submit(store, delay_seconds=300)
    store.clock_offset_seconds = 100
    stats = await store.stats()
    assert stats.counts.get("queued") == 1
    assert stats.oldest_queued_age_seconds is None
    store.clock_offset_seconds = 310
    stats = await store.stats()
    assert stats.oldest_queued_age_seconds == pytest.approx(10, abs=CLOCK_SLACK)


async def test_health_reports_ages_by_deployment_leases_and_workers(store: Store) -> None:
    await submit(store)
    await make_run(store, Status.RUNNING, max_attempts=2)  # stale by the time we look
    await store.register_worker(WorkerInfo(id="w-old", hostname="h", pid=1, deployment_id=None))
    store.clock_offset_seconds = 30
    await submit(store, deployment_id="gpu")
    await submit(store, deployment_id="gpu", delay_seconds=1000)
    await store.register_worker(WorkerInfo(id="w-new", hostname="h", pid=2, deployment_id="gpu"))
    store.clock_offset_seconds = 30 + GRACE + 5
    await make_run(store, Status.RUNNING, max_attempts=2)  # a fresh lease, not expired
    health = await store.health(lock_grace_seconds=GRACE, worker_max_age_seconds=80)
    assert health.counts.get("queued") == 3
    assert health.counts.get("running") == 2
    assert health.oldest_queued_age_seconds == pytest.approx(30 + GRACE + 5, abs=CLOCK_SLACK)
    assert set(health.oldest_queued_age_by_deployment) == {"", "gpu"}
    assert health.oldest_queued_age_by_deployment[""] == pytest.approx(
        30 + GRACE + 5, abs=CLOCK_SLACK
    )
    assert health.oldest_queued_age_by_deployment["gpu"] == pytest.approx(
        GRACE + 5, abs=CLOCK_SLACK
    )
    assert health.expired_leases == 1
    assert health.live_workers == 1


# =========================================================================================
# list_jobs
# =========================================================================================


async def _spread_runs(store: Store, n: int, **fields: Any) -> list[Run]:
    """n runs created one second apart (database clock), so created_at never ties."""
    runs = []
    for i in range(n):
        store.clock_offset_seconds = float(i)
        runs.append(await submit(store, **fields))
    store.clock_offset_seconds = float(n)
    return runs


async def test_list_jobs_pages_newest_first_by_default(store: Store) -> None:
    runs = await _spread_runs(store, 25)
    newest_first = [r.id for r in reversed(runs)]
    page1 = await store.list_jobs(limit=10)
    assert (page1.page, page1.limit, page1.total_count, page1.total_pages) == (1, 10, 25, 3)
    assert [r.id for r in page1.data] == newest_first[:10]
    page3 = await store.list_jobs(limit=10, page=3)
    assert [r.id for r in page3.data] == newest_first[20:]
    past = await store.list_jobs(limit=10, page=4)
    assert past.data == []
    assert past.total_count == 25


async def test_list_jobs_sort_order_and_whitelist(store: Store) -> None:
    runs = await _spread_runs(store, 5)
    asc = await store.list_jobs(sort_by="created_at", sort_order="asc")
    assert [r.id for r in asc.data] == [r.id for r in runs]
    for evil in ("id; DROP TABLE runs", "payload", "nonsense", "created_at desc, (select 1)"):
        page = await store.list_jobs(sort_by=evil, sort_order="desc")
        assert [r.id for r in page.data] == [r.id for r in reversed(runs)], evil
    assert await store.count_runs() == 5


async def test_list_jobs_sorts_by_priority(store: Store) -> None:
    a = await submit(store, priority=3)
    b = await submit(store, priority=-1)
    c = await submit(store, priority=7)
    page = await store.list_jobs(sort_by="priority", sort_order="asc")
    assert [r.id for r in page.data] == [b.id, a.id, c.id]
    page = await store.list_jobs(sort_by="priority", sort_order="desc")
    assert [r.id for r in page.data] == [c.id, a.id, b.id]


async def test_list_jobs_filters_by_status(store: Store) -> None:
    failed = await make_run(store, Status.FAILED)
    cancelled = await make_run(store, Status.CANCELLED)
    await make_run(store, Status.QUEUED)
    await make_run(store, Status.COMPLETED)
    only_failed = await store.list_jobs(where=RunFilter(statuses=(Status.FAILED,)))
    assert [r.id for r in only_failed.data] == [failed.id]
    assert only_failed.total_count == 1
    both = await store.list_jobs(where=RunFilter(statuses=(Status.FAILED, Status.CANCELLED)))
    assert {r.id for r in both.data} == {failed.id, cancelled.id}
    assert both.total_count == 2
    everything = await store.list_jobs()
    assert everything.total_count == 4


async def test_list_jobs_filters_by_user(store: Store) -> None:
    mine = [await submit(store, user_id="alice") for _ in range(3)]
    await submit(store, user_id="bob")
    await submit(store)
    page = await store.list_jobs(where=RunFilter(user_id="alice"), limit=2)
    assert page.total_count == 3
    assert len(page.data) == 2
    assert all(r.user_id == "alice" for r in page.data)
    rest = await store.list_jobs(where=RunFilter(user_id="alice"), limit=2, page=2)
    assert {r.id for r in page.data + rest.data} == {r.id for r in mine}


async def test_list_jobs_returns_opened_runs(store: Store) -> None:
    await submit(store, payload={"p": "visible"})
    [run] = (await store.list_jobs()).data
    assert run.payload == {"p": "visible"}
    assert run.status is Status.QUEUED


# =========================================================================================
# sealing at rest
# =========================================================================================

MARKER = "PLAINTEXT-MARKER-7f3a"


async def test_sealed_columns_do_not_hold_plaintext(handle: StoreHandle, key_ring: KeyRing) -> None:
    store = handle.store
    paused = await make_run(
        store,
        Status.PAUSED,
        payload={"q": MARKER + "-payload"},
        state={"s": MARKER + "-state"},
    )
    await store.continue_(paused.id, {"d": MARKER + "-decision"})
    done = await make_run(
        store, Status.COMPLETED, payload={"q": MARKER}, answer={"a": MARKER + "-answer"}
    )
    [bulk_id] = await store.submit_many([new_run(payload={"q": MARKER + "-bulk"})])
    for rid, columns in (
        (paused.id, ("payload", "resume_state", "decision")),
        (done.id, ("payload", "answer")),
        (bulk_id, ("payload",)),
    ):
        raw = await handle.raw_row(rid)
        for column in columns:
            value = raw[column]
            assert isinstance(value, bytes), (rid, column)
            assert MARKER.encode() not in value, f"{column} of {rid} is stored in clear"
            assert sealed_key_id(value) == key_ring.sealing_key_id, (rid, column)
    assert (await get(store, bulk_id)).payload == {"q": MARKER + "-bulk"}


async def test_a_value_moved_to_another_column_does_not_open(handle: StoreHandle) -> None:
    run = await make_run(handle.store, Status.COMPLETED)
    await handle.raw_execute("UPDATE {runs} SET answer = payload WHERE id = ?", run.id)
    with pytest.raises(SealError):
        await handle.store.get(run.id)


async def test_a_value_moved_to_another_run_does_not_open(handle: StoreHandle) -> None:
    a = await submit(handle.store, payload={"who": "a"})
    b = await submit(handle.store, payload={"who": "b"})
    raw_a = (await handle.raw_row(a.id))["payload"]
    await handle.raw_execute("UPDATE {runs} SET payload = ? WHERE id = ?", raw_a, b.id)
    with pytest.raises(SealError):
        await handle.store.get(b.id)
    assert (await get(handle.store, a.id)).payload == {"who": "a"}


async def test_a_cleartext_value_is_refused(handle: StoreHandle) -> None:
    run = await submit(handle.store)
    await handle.raw_execute(
        "UPDATE {runs} SET payload = ? WHERE id = ?", b'{"text":"injected"}', run.id
    )
    with pytest.raises(SealError):
        await handle.store.get(run.id)


async def test_a_store_without_the_key_cannot_open(handle: StoreHandle) -> None:
    run = await submit(handle.store)
    stranger = await handle.open_another(KeyRing([bytes(range(100, 132))]))
    with pytest.raises(SealError):
        await stranger.get(run.id)


async def test_a_claimed_run_that_does_not_open_goes_back_to_queued(
    handle: StoreHandle,
) -> None:
    """A replica with the wrong keys claims a run it cannot open: the run goes back to
    queued at once, without spending an attempt, with the reason in ``error``; the claim
    names it in ``unopenable``, and a replica with the right key then runs it."""
    run = await submit(handle.store)
    stranger = await handle.open_another(KeyRing([bytes(range(100, 132))]))
    claimed = await stranger.claim("wrong-keys", 5, deployment_id=None)
    assert list(claimed) == []
    assert claimed.unopenable == (run.id,)
    back = await get(handle.store, run.id)
    assert (back.status, back.attempt, back.locked_by) == (Status.QUEUED, 0, None)
    assert back.started_at is None
    assert back.error is not None
    assert back.error.startswith("not executed: ")
    right = await handle.store.claim("right-keys", 5, deployment_id=None)
    assert [r.id for r in right] == [run.id]
    assert right.unopenable == ()
    assert right[0].attempt == 1


@pytest.mark.timeout(240)
async def test_reseal_rotation_leaves_every_run_readable_with_the_new_key(
    handle: StoreHandle,
) -> None:
    old_key, new_key = TEST_KEY, bytes(range(32, 64))
    store = handle.store
    total = 3000
    expected: dict[str, Any] = {}
    for start in range(0, total, 500):
        news = [new_run(payload={"i": i, "m": MARKER}) for i in range(start, start + 500)]
        for got_id, new in zip(await store.submit_many(news), news, strict=True):
            expected[got_id] = new.payload
    values = total
    claimed = await store.claim("w1", 100, deployment_id=None)
    answers = {r.id: {"answer": r.payload["i"]} for r in claimed[:90]}
    await store.complete_many(
        "w1", [Completion(run_id=rid, attempt=1, answer=a) for rid, a in answers.items()]
    )
    values += len(answers)
    paused_ids = [r.id for r in claimed[90:]]
    for r in claimed[90:]:
        assert await store.pause("w1", r.lease, reason="approval", state={"i": r.payload["i"]})
    values += len(paused_ids)
    for rid in paused_ids[:4]:
        await store.continue_(rid, {"ok": rid})
    values += 4

    rotating = await handle.open_another(KeyRing([new_key, old_key]))
    after, resealed, pages = "", 0, 0
    while True:
        last, n = await rotating.reseal_page(after_id=after, limit=500)
        resealed += n
        pages += 1
        assert pages < 100, "reseal_page never reported it was done"
        if last is None:
            break
        assert last > after, "reseal_page must move forward"
        after = last
    assert resealed == values

    new_only = await handle.open_another(KeyRing([new_key]))
    seen: dict[str, Run] = {}
    page = 1
    while True:
        listing = await new_only.list_jobs(limit=1000, page=page, sort_order="asc")
        if not listing.data:
            break
        seen.update({r.id: r for r in listing.data})
        page += 1
    assert set(seen) == set(expected)
    for rid, payload in expected.items():
        assert seen[rid].payload == payload
    for rid, answer in answers.items():
        assert seen[rid].answer == answer
    for rid in paused_ids[:4]:
        assert seen[rid].resume is not None
        assert seen[rid].resume.decision == {"ok": rid}
    for rid in paused_ids[4:]:
        assert seen[rid].resume == Resume(state={"i": seen[rid].payload["i"]}, decision=None)

    rows = await handle.raw_fetch("SELECT payload, answer, resume_state, decision FROM {runs}")
    new_id = key_id_of(new_key)
    for row in rows:
        for column, value in row.items():
            if value is not None:
                assert sealed_key_id(bytes(value)) == new_id, column


# =========================================================================================
# worker registry
# =========================================================================================


async def test_worker_registry(store: Store) -> None:
    now = await store.now()
    await store.register_worker(WorkerInfo(id="w1", hostname="host-a", pid=11, deployment_id=None))
    await store.register_worker(WorkerInfo(id="w2", hostname="host-b", pid=22, deployment_id="gpu"))
    workers = {w.id: w for w in await store.list_workers(max_age_seconds=GRACE)}
    assert set(workers) == {"w1", "w2"}
    assert (workers["w1"].hostname, workers["w1"].pid, workers["w1"].deployment_id) == (
        "host-a",
        11,
        None,
    )
    assert workers["w2"].deployment_id == "gpu"
    assert workers["w2"].last_seen_at == pytest.approx(now, abs=CLOCK_SLACK)
    assert workers["w2"].started_at == pytest.approx(now, abs=CLOCK_SLACK)

    await store.register_worker(WorkerInfo(id="w1", hostname="host-a", pid=12, deployment_id=None))
    again = [w for w in await store.list_workers(max_age_seconds=GRACE) if w.id == "w1"]
    assert len(again) == 1, "registering again must not duplicate the worker"

    await store.remove_worker("w1")
    assert [w.id for w in await store.list_workers(max_age_seconds=GRACE)] == ["w2"]


async def test_stale_workers_are_hidden_and_pruned(store: Store) -> None:
    await store.register_worker(WorkerInfo(id="w-old", hostname="h", pid=1, deployment_id=None))
    await store.register_worker(WorkerInfo(id="w-live", hostname="h", pid=2, deployment_id=None))
    run = await make_run(store, Status.RUNNING, worker="w-live", max_attempts=2)
    store.clock_offset_seconds = 100
    assert await store.list_workers(max_age_seconds=50) == []
    await store.heartbeat_many("w-live", [run.lease])
    assert [w.id for w in await store.list_workers(max_age_seconds=50)] == ["w-live"]
    assert await store.prune_workers(max_age_seconds=50) == 1
    assert [w.id for w in await store.list_workers(max_age_seconds=1000)] == ["w-live"]


# =========================================================================================
# usage and budget counters
# =========================================================================================


async def test_record_usage_adds_to_the_run_and_the_counters(store: Store) -> None:
    run = await make_run(store, Status.RUNNING, worker="w1")
    k_user = UsageKey("user", "u1", 1_700_000_000.0)
    k_cfg = UsageKey("configuration", "c1", 1_700_000_000.0)
    await store.record_usage("w1", run.lease, tokens=10, cost=0.25, keys=[k_user, k_cfg])
    await store.record_usage("w1", run.lease, tokens=5, cost=0.5, keys=[k_user])
    got = await get(store, run.id)
    assert got.tokens == 15
    assert got.cost == pytest.approx(0.75)
    totals = await store.usage_totals([k_user, k_cfg])
    assert totals[k_user].tokens == 15
    assert totals[k_user].cost == pytest.approx(0.75)
    assert totals[k_user].runs == 0
    assert totals[k_cfg].tokens == 10
    assert totals[k_cfg].cost == pytest.approx(0.25)


async def test_record_usage_is_not_fenced(store: Store) -> None:
    run = await make_run(store, Status.COMPLETED, worker="w1")
    key = UsageKey("user", "u1", 0.0)
    await store.record_usage("w-zombie", run.lease, tokens=7, cost=1.5, keys=[key])
    got = await get(store, run.id)
    assert (got.tokens, got.cost) == (7, pytest.approx(1.5))
    assert (await store.usage_totals([key]))[key].tokens == 7


async def test_usage_in_periods_reads_every_counter_of_the_periods(store: Store) -> None:
    run = await make_run(store, Status.RUNNING, worker="w1")
    day1, day2 = 1_700_000_000.0, 1_700_086_400.0
    keys = [
        UsageKey("user", "u1", day1),
        UsageKey("user", "u2", day1),
        UsageKey("configuration", "c1", day1),
        UsageKey("user", "u1", day2),
    ]
    await store.record_usage("w1", run.lease, tokens=3, cost=0.5, keys=keys)
    await store.count_claimed_run([keys[0]])
    found = await store.usage_in_periods([("user", day1)])
    assert set(found) == {keys[0], keys[1]}
    assert found[keys[0]] == UsageTotals(cost=pytest.approx(0.5), tokens=3, runs=1)
    both = await store.usage_in_periods([("user", day1), ("configuration", day1)])
    assert set(both) == set(keys[:3])
    assert await store.usage_in_periods([("user", 0.0)]) == {}
    assert await store.usage_in_periods([]) == {}


async def test_count_claimed_run_and_missing_counters(store: Store) -> None:
    k1 = UsageKey("user", "u1", 100.0)
    k2 = UsageKey("both", "u1|c1", 100.0)
    k_other_period = UsageKey("user", "u1", 200.0)
    await store.count_claimed_run([k1, k2])
    await store.count_claimed_run([k1])
    totals = await store.usage_totals([k1, k2, k_other_period])
    assert totals[k1].runs == 2
    assert totals[k2].runs == 1
    assert totals[k_other_period] == UsageTotals()
    assert await store.usage_totals([]) == {}


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
