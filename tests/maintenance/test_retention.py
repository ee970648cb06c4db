"""``Retention.run_once`` against a store that fails on demand: batch after batch until
one comes back short, bounded per pass, and a failure ends the pass (the loop retries)."""

from __future__ import annotations

from typing import Any

import pytest
from fake_store import FakeStore

from runq.errors import StoreUnavailable
from runq.maintenance.retention import Retention, RetentionConfig

pytestmark = [pytest.mark.anyio]


def retention(store: FakeStore, batch_size: int = 10) -> Retention:
    config = RetentionConfig(
        retention_seconds=3600.0, paused_retention_seconds=0.0, interval=60.0, batch_size=batch_size
    )
    fake: Any = store
    return Retention(fake, config)


async def test_deletes_batch_after_batch_until_one_comes_back_short() -> None:
    store = FakeStore()
    store.purges = [10, 10, 3]
    report = await retention(store).run_once()
    assert (report.deleted, report.batches) == (23, 3)
    assert store.calls["purge_batch"] == 3


async def test_nothing_old_enough_is_one_short_statement() -> None:
    store = FakeStore()
    report = await retention(store).run_once()
    assert (report.deleted, report.batches) == (0, 0)
    assert store.calls["purge_batch"] == 1


async def test_one_pass_over_a_huge_backlog_ends_and_leaves_the_rest() -> None:
    store = FakeStore()
    store.purges = [1] * 5000
    report = await retention(store, batch_size=1).run_once()
    assert report.batches == 1000
    assert len(store.purges) == 4000


async def test_a_failure_ends_the_pass_and_the_next_pass_goes_on() -> None:
    store = FakeStore()
    service = retention(store)
    store.purges = [10]
    store.go_away()
    with pytest.raises(StoreUnavailable):
        await service.run_once()
    store.come_back()
    assert (await service.run_once()).deleted == 10
