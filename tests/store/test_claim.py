"""The store conformance suite, claims: leases and order, deployment affinity, the session
rule, budget blocks, claim by id and concurrent claimers.
"""

from __future__ import annotations

import pytest
from conformance_support import (
    claim,
    get,
    ids,
    store,
)
from factories import (
    StoreHandle,
    engine_ready,
    handle,
    make_run,
    new_run,
    submit,
)
from helpers import gather, ordered_run_id

from runq.model import (
    BudgetBlock,
    Completion,
    FailOutcome,
    Lease,
    Status,
)
from runq.seal import KeyRing
from runq.store.base import Store

pytestmark = pytest.mark.anyio

__all__ = ["engine_ready", "handle", "store"]  # fixtures used by name


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
