"""The console's new pure parts: the chart's buckets and drawing, the limits page's sums,
the runs table's version digest, and the shared caches that keep tabs from adding load."""

from __future__ import annotations

import anyio
import pytest

from runq.config import LimitConfig
from runq.limits import LimitRules, LimitState, Pause
from runq.listing import Page
from runq.model import Actor, QueuedCount, Run, Status
from runq.ops.limits_use import limits_use
from runq.ui.chart import HEIGHT, MINUTES, ThroughputCache, throughput_from_rows
from runq.ui.live_runs import ChangeHint, ListingCache, page_version

pytestmark = pytest.mark.anyio

NOW = 1_800_000_030.0  # 30 s into a minute
MINUTE = int(NOW // 60) * 60


def test_rows_become_sixty_minutes_ending_now() -> None:
    rows = [
        (MINUTE, "completed", 4),
        (MINUTE, "failed", 1),
        (MINUTE - 600, "completed", 2),
        (MINUTE, "cancelled", 7),  # not throughput: left out
        (MINUTE - 3600, "completed", 9),  # one minute too old
    ]
    t = throughput_from_rows(NOW, rows)
    assert len(t.minutes) == MINUTES
    assert t.minutes[-1].start == MINUTE
    assert t.minutes[0].start == MINUTE - 59 * 60
    assert (t.completed, t.failed) == (6, 1)
    assert t.busiest is not None
    assert t.busiest.start == MINUTE
    assert [m.start for m in t.active_minutes] == [MINUTE, MINUTE - 600]
    assert t.scale == 5


def test_bars_stack_failed_on_completed_within_the_plot() -> None:
    t = throughput_from_rows(NOW, [(MINUTE, "completed", 3), (MINUTE, "failed", 2)])
    bar = t.bars()[-1]
    assert bar.completed_height > 0
    assert bar.failed_height > 0
    assert bar.failed_y + bar.failed_height == pytest.approx(bar.completed_y)
    assert bar.failed_y >= 0
    assert bar.completed_y + bar.completed_height <= HEIGHT
    assert all(b.completed_height == 0 for b in t.bars()[:-1])


def test_an_empty_hour_has_no_busiest_minute() -> None:
    t = throughput_from_rows(NOW, [])
    assert t.busiest is None
    assert t.scale == 1
    assert t.active_minutes == []


async def test_the_chart_cache_reads_once_for_many_requests() -> None:
    reads = 0

    async def read() -> tuple[float, list[tuple[float, str, int]]]:
        nonlocal reads
        reads += 1
        await anyio.sleep(0.01)
        return NOW, [(MINUTE, "completed", 1)]

    cache = ThroughputCache(read, cache_seconds=60)
    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(cache.get)
    assert reads == 1


async def test_the_chart_cache_serves_the_last_counts_when_a_read_fails() -> None:
    calls = 0

    async def read() -> tuple[float, list[tuple[float, str, int]]]:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise OSError("database away")
        return NOW, [(MINUTE, "completed", 1)]

    cache = ThroughputCache(read, cache_seconds=0)
    first = await cache.get()
    assert (await cache.get()) is first


def _run(run_id: str, status: Status = Status.QUEUED, updated: float = 1.0) -> Run:
    return Run(
        id=run_id,
        component_type="task",
        component_id="echo",
        status=status,
        attempt=0,
        max_attempts=1,
        priority=0,
        session_id=None,
        user_id=None,
        actor=Actor(),
        configuration=None,
        deployment_id=None,
        idempotency_key=None,
        origin="test",
        created_at=1.0,
        updated_at=updated,
        available_at=1.0,
        started_at=None,
        completed_at=None,
        locked_by=None,
        locked_at=None,
        error=None,
        termination_reason=None,
        pause_reason=None,
        cancel_requested=False,
        non_idempotent=False,
        has_request=True,
    )


def test_the_version_changes_with_any_shown_row() -> None:
    page = Page(data=[_run("a"), _run("b")], page=1, limit=50, total_count=2)
    same = Page(data=[_run("a"), _run("b")], page=1, limit=50, total_count=2)
    moved = Page(data=[_run("a", Status.RUNNING, 2.0), _run("b")], page=1, limit=50, total_count=2)
    more = Page(data=[_run("c"), _run("a"), _run("b")], page=1, limit=50, total_count=3)
    assert page_version(page) == page_version(same)
    assert len({page_version(page), page_version(moved), page_version(more)}) == 3


async def test_streams_on_one_view_share_a_read() -> None:
    reads = 0

    async def read() -> Page:
        nonlocal reads
        reads += 1
        await anyio.sleep(0.01)
        return Page(data=[], page=1, limit=50, total_count=0)

    cache = ListingCache(seconds=60)
    async with anyio.create_task_group() as tg:
        for _ in range(10):
            tg.start_soon(cache.get, ("status=queued", None), read)
        tg.start_soon(cache.get, ("status=failed", None), read)
    assert reads == 2


async def test_a_hint_wakes_every_waiting_stream() -> None:
    hint = ChangeHint()
    woke: list[int] = []

    async def waiter(i: int) -> None:
        await hint.wait(30)
        woke.append(i)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for i in range(3):
                tg.start_soon(waiter, i)
            await anyio.wait_all_tasks_blocked()  # every waiter is inside hint.wait
            hint.fire("some-run")
    assert sorted(woke) == [0, 1, 2]


def test_limits_use_sums_running_held_and_paused_per_group() -> None:
    rules = LimitRules.from_limits(
        {
            "task/sleep": LimitConfig(max_running=2),
            "task/*": LimitConfig(rate="5/minute"),
            "team/*": LimitConfig(max_running_per_key=1),
        }
    )
    state = LimitState(
        now=NOW,
        running={"task/sleep": 2, "task/echo": 1, "team/a": 2},
        windows={"task/*": (NOW // 60 * 60, 5)},
        keys={("team/a", "k1"): 1, ("team/a", "k2"): 1},
    )
    pause = Pause(
        id="p1", kind="deployment", target="gpu", reason=None, created_by=None, created_at=1.0
    )
    queued = [
        QueuedCount("task/sleep", "", 3, 1),
        QueuedCount("task/echo", "", 4, 0),
        QueuedCount("task/echo", "gpu", 2, 0),  # held by the pause, not the rate
        QueuedCount("other/x", "", 9, 0),  # in no group
    ]
    groups, pauses = limits_use(rules, state, [pause], queued)
    by = {g.rule.pattern: g for g in groups}
    assert (by["task/sleep"].running, by["task/sleep"].ready, by["task/sleep"].held) == (2, 3, 3)
    assert (by["task/*"].running, by["task/*"].rate_used, by["task/*"].held) == (1, 5, 4)
    assert by["task/*"].rate_window_ends == NOW // 60 * 60 + 60
    assert by["team/*"].keys_at_cap == 2
    assert by["team/*"].held == 0
    assert [(p.pause.id, p.held) for p in pauses] == [("p1", 2)]
