"""``Reaper.run_once`` against a store that fails on demand: what a pass settles and what it
wakes, and the outage rule - after a pass that could not reach the database, reaping
resumes only one lock grace after the database answers again."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from fake_store import FakeStore

import runq.maintenance.reaper as reaper_module
from runq.errors import StoreUnavailable
from runq.maintenance.reaper import Reaper, ReaperConfig
from runq.model import ReapReport

pytestmark = [pytest.mark.anyio]

GRACE = 30.0


class Clock:
    """The reaper's monotonic clock, moved by the test instead of waited for."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    made = Clock()
    monkeypatch.setattr(reaper_module, "time", SimpleNamespace(monotonic=made.monotonic))
    return made


def reaper(store: FakeStore, woken: list[int] | None = None) -> Reaper:
    config = ReaperConfig(
        lock_grace_seconds=GRACE,
        limit=50,
        interval=1.0,
        privacy_level="full",
        redacted_max_chars=100,
    )
    on_requeued = None if woken is None else lambda: woken.append(1)
    fake: Any = store  # the verbs the reaper calls, and nothing else
    return Reaper(fake, config, on_requeued=on_requeued)


async def test_a_pass_settles_stale_runs_wakes_claimers_and_trims_the_dead_letters(
    clock: Clock,
) -> None:
    store, woken = FakeStore(), []
    store.reaps.append(
        ReapReport(requeued=1, dead_lettered=1, requeued_ids=["a"], dead_lettered_ids=["b"])
    )
    report = await reaper(store, woken).run_once()
    assert (report.requeued, report.dead_lettered) == (1, 1)
    assert woken == [1]
    assert store.trimmed == ["b"]  # a settled run's events are trimmed as at any settle


async def test_each_run_about_to_execute_again_is_one_warning(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    store = FakeStore()
    store.reaps.append(ReapReport(requeued=2, requeued_ids=["a", "c"]))
    caplog.set_level(logging.INFO, logger="runq.maintenance.reaper")
    await reaper(store).run_once()
    again = [
        getattr(r, "runq_fields", {})
        for r in caplog.records
        if r.levelno == logging.WARNING and r.getMessage() == "run.executing_again"
    ]
    assert [(w["run_id"], w["reason"]) for w in again] == [
        ("a", "lease_expired"),
        ("c", "lease_expired"),
    ]


async def test_nothing_requeued_wakes_nobody(clock: Clock) -> None:
    store, woken = FakeStore(), []
    assert await reaper(store, woken).run_once() == ReapReport()
    assert woken == []


async def test_a_failed_trim_is_logged_and_the_pass_still_reports(clock: Clock) -> None:
    store = FakeStore()
    store.fail_trim = True
    store.reaps.append(ReapReport(dead_lettered=1, dead_lettered_ids=["b"]))
    assert (await reaper(store).run_once()).dead_lettered == 1


async def test_after_an_outage_reaping_waits_one_grace_once_the_database_answers(
    clock: Clock,
) -> None:
    store = FakeStore()
    service = reaper(store)
    store.go_away()
    with pytest.raises(StoreUnavailable):
        await service.run_once()
    # Still away: the pass only pings, and fails.
    with pytest.raises(StoreUnavailable):
        await service.run_once()
    assert store.calls["reap_stale"] == 1
    store.come_back()
    # Back: no worker could heartbeat meanwhile, so stale leases say nothing yet.
    assert await service.run_once() == ReapReport()
    clock.now += GRACE - 1
    assert await service.run_once() == ReapReport()
    assert store.calls["reap_stale"] == 1
    clock.now += 1
    store.reaps.append(ReapReport(requeued=2, requeued_ids=["a", "b"]))
    assert (await service.run_once()).requeued == 2
    assert store.calls["reap_stale"] == 2


async def test_any_failed_pass_counts_as_an_outage(clock: Clock) -> None:
    """Not only an unreachable database: whatever made the pass fail, stale leases after it
    are not trusted until a grace has passed."""
    store = FakeStore()
    service = reaper(store)
    store.go_away(RuntimeError("a statement timed out"))
    with pytest.raises(RuntimeError):
        await service.run_once()
    store.come_back()
    assert await service.run_once() == ReapReport()
    assert store.calls["ping"] == 1
