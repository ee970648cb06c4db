"""The claim applies ``[limits]`` and pauses (both engines, one store, no daemon)."""

from __future__ import annotations

from collections import Counter

import anyio
import pytest

from runq.config import LimitConfig
from runq.limits import LimitRules
from runq.model import Actor, BudgetBlock, Completion, NewRun, QueuedCount, Run
from runq.store.base import Store

pytestmark = pytest.mark.anyio


async def submit(store: Store, component: str, n: int, **kw: object) -> list[str]:
    ctype, _, cid = component.partition("/")
    news = [NewRun(component_type=ctype, component_id=cid, **kw) for _ in range(n)]  # type: ignore[arg-type]
    return await store.submit_many(news)


def by_component(runs: list[Run]) -> Counter[str]:
    return Counter(r.component for r in runs)


async def test_a_limit_caps_one_claim_and_the_runs_behind_go_on(store: Store) -> None:
    store.limits = LimitRules.from_limits({"agent/*": LimitConfig(max_running=4)})
    await submit(store, "agent/summarize", 10)
    await submit(store, "task/email", 5)  # behind the limited runs in claim order
    first = await store.claim("w1", 16, deployment_id=None)
    assert by_component(list(first)) == {"agent/summarize": 4, "task/email": 5}
    again = await store.claim("w2", 16, deployment_id=None)
    assert list(again) == []  # 4/4 running, nothing else queued


async def test_most_specific_pattern_wins(store: Store) -> None:
    store.limits = LimitRules.from_limits(
        {"agent/*": LimitConfig(max_running=1), "agent/summarize": LimitConfig(max_running=3)}
    )
    await submit(store, "agent/summarize", 5)
    await submit(store, "agent/plan", 5)
    claimed = await store.claim("w1", 16, deployment_id="blue")
    assert by_component(list(claimed)) == {"agent/summarize": 3, "agent/plan": 1}


async def test_concurrent_claimers_never_over_admit(store: Store) -> None:
    store.limits = LimitRules.from_limits({"agent/*": LimitConfig(max_running=4)})
    await submit(store, "agent/summarize", 40)
    claimed: list[Run] = []

    async def claimer(name: str) -> None:
        for _ in range(5):
            claimed.extend(await store.claim(name, 16, deployment_id=None))

    async with anyio.create_task_group() as tg:
        for i in range(6):
            tg.start_soon(claimer, f"w{i}")
    assert len(claimed) == 4


async def test_rate_counts_starts_per_window(store: Store) -> None:
    store.limits = LimitRules.from_limits({"task/email": LimitConfig(rate="3/hour")})
    await submit(store, "task/email", 5)
    await submit(store, "task/other", 2)
    first = await store.claim("w1", 2, deployment_id=None)
    rest = await store.claim("w1", 16, deployment_id=None)
    assert by_component(list(first) + list(rest)) == {"task/email": 3, "task/other": 2}
    # Finishing runs frees no start: the window counts starts, not running runs.
    store.clock_offset_seconds = 3600.0
    assert by_component(list(await store.claim("w1", 16, deployment_id=None))) == {"task/email": 2}


async def test_a_pause_skips_matching_runs_until_resumed(store: Store) -> None:
    await submit(store, "agent/summarize", 2)
    await submit(store, "task/email", 1)
    pause, created = await store.add_pause(
        "component", "agent/*", reason="provider outage", created_by="ops"
    )
    assert created
    again, created_again = await store.add_pause(
        "component", "agent/*", reason=None, created_by=None
    )
    assert (again.id, created_again) == (pause.id, False)
    assert [p.target for p in await store.list_pauses()] == ["agent/*"]
    assert by_component(list(await store.claim("w1", 16, deployment_id=None))) == {"task/email": 1}
    removed = await store.remove_pause(pause.id)
    assert removed is not None
    assert removed.id == pause.id
    assert await store.list_pauses() == []
    assert by_component(list(await store.claim("w1", 16, deployment_id=None))) == {
        "agent/summarize": 2
    }


async def test_a_deployment_pause(store: Store) -> None:
    await submit(store, "task/email", 1, deployment_id="blue")
    await submit(store, "task/email", 1)
    await store.add_pause("deployment", "blue", reason=None, created_by=None)
    claimed = list(await store.claim("w1", 16, deployment_id="blue"))
    assert [r.deployment_id for r in claimed] == [None]
    assert await store.remove_pause("", kind="deployment", target="blue") is not None
    claimed = list(await store.claim("w1", 16, deployment_id="blue"))
    assert [r.deployment_id for r in claimed] == ["blue"]


async def test_one_running_run_per_key(store: Store) -> None:
    store.limits = LimitRules.from_limits({"task/*": LimitConfig(max_running_per_key=1)})
    await submit(store, "task/sync", 3, concurrency_key="tenant-a")
    await submit(store, "task/sync", 2, concurrency_key="tenant-b")
    await submit(store, "task/sync", 2)  # no key: not limited by key
    first = list(await store.claim("w1", 16, deployment_id=None))
    assert Counter(r.concurrency_key for r in first) == {"tenant-a": 1, "tenant-b": 1, None: 2}
    assert list(await store.claim("w2", 16, deployment_id=None)) == []
    done = next(r for r in first if r.concurrency_key == "tenant-a")
    await store.complete_many("w1", [Completion(run_id=done.id, attempt=done.attempt, answer=None)])
    again = list(await store.claim("w2", 16, deployment_id=None))
    assert [r.concurrency_key for r in again] == ["tenant-a"]


async def test_queued_counts_name_the_runs_the_budget_holds_back(store: Store) -> None:
    """The exporter's budget count uses the claim's own exclusion: what it counts as held
    is exactly what a claim with the same block leaves queued."""
    await submit(store, "task/a", 2, actor=Actor(user_id="alice"))
    await submit(store, "task/a", 1, actor=Actor(user_id="bob"), configuration="gpt")
    await submit(store, "task/a", 1, actor=Actor(user_id="carol"), configuration="small")
    await submit(store, "task/a", 1, actor=Actor(user_id="alice"), delay_seconds=3600)
    await submit(store, "task/b", 1, actor=Actor(user_id="dave"), configuration="mini")
    block = BudgetBlock(
        users=frozenset({"alice"}),
        configurations=frozenset({"gpt"}),
        pairs=frozenset({("dave", "mini")}),
    )
    counts = {c.component: c for c in await store.queued_by_component(block)}
    assert counts["task/a"] == QueuedCount("task/a", "", 4, 1, 3)  # alice twice, gpt once
    assert counts["task/b"] == QueuedCount("task/b", "", 1, 0, 1)  # the (dave, mini) pair
    unblocked = await store.queued_by_component()
    assert {c.budget_held for c in unblocked} == {0}
    claimed = await store.claim("w1", 16, deployment_id=None, blocked=block)
    assert [r.user_id for r in claimed] == ["carol"]
