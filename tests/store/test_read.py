"""The store conformance suite, the reads: stats and health, job listings, the worker registry
and the usage counters.
"""

from __future__ import annotations

from typing import Any

import pytest
from conformance_support import (
    CLOCK_SLACK,
    GRACE,
    get,
    store,
)
from factories import (
    engine_ready,
    handle,
    make_run,
    submit,
)

from runq.listing import RunFilter
from runq.model import (
    Run,
    Status,
    UsageKey,
    UsageTotals,
    WorkerInfo,
)
from runq.store.base import Store

pytestmark = pytest.mark.anyio

__all__ = ["engine_ready", "handle", "store"]  # fixtures used by name


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
