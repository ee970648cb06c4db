"""Claims from the queue's head (PostgreSQL, ``runq/store/postgres/claim_head.py``): while claims
come back full, a claim starts at the head read at most a second ago instead of walking the
dead index entries of every run claimed since the last vacuum. The claim order must not
change: priority first, then ``available_at``, then id; a run of a better priority that
arrives mid-backlog goes first; a run given back before the head is found once the head
is read again; a short claim still sees the whole queue."""

from __future__ import annotations

import math

import pytest
from factories import StoreHandle, engine_ready, handle, new_run

import runq.store.postgres.claim_head as head_module
from runq.model import Lease, Run
from runq.store.base import Store

pytestmark = pytest.mark.anyio

__all__ = ["engine_ready", "handle"]  # fixtures used by name


async def _submit(store: Store, count: int, priority: int = 0) -> list[str]:
    return await store.submit_many([new_run(priority=priority) for _ in range(count)])


async def _claim(store: Store, slots: int) -> list[Run]:
    return list(await store.claim("w1", slots, deployment_id=None, serialize_sessions=False))


def _head(store: Store) -> object:
    return store._claim_head  # type: ignore[attr-defined]


@pytest.fixture
def pg(handle: StoreHandle) -> Store:
    if handle.engine != "postgres":
        pytest.skip("the claim head is PostgreSQL's (SQLite leaves no dead index entries)")
    return handle.store


async def test_a_backlog_is_claimed_in_order_from_the_head(pg: Store) -> None:
    ids = await _submit(pg, 100)
    claimed: list[str] = []
    for _ in range(10):
        claimed += [run.id for run in await _claim(pg, 10)]
    assert claimed == ids  # submission order is claim order at one priority
    assert await _claim(pg, 10) == []


async def test_a_better_priority_arriving_mid_backlog_goes_first(pg: Store) -> None:
    await _submit(pg, 60)
    first = await _claim(pg, 10)
    second = await _claim(pg, 10)  # from the head now
    assert len(first) == len(second) == 10
    assert _head(pg).backlog  # type: ignore[attr-defined]
    (urgent,) = await _submit(pg, 1, priority=-1)
    (worse,) = await _submit(pg, 1, priority=5)
    third = await _claim(pg, 10)
    assert third[0].id == urgent
    assert worse not in [run.id for run in third]
    rest: list[Run] = []
    while batch := await _claim(pg, 10):
        rest += batch
    assert rest[-1].id == worse  # the worst priority last


async def test_a_run_given_back_before_the_head_is_found_at_the_next_head_read(
    pg: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(head_module, "HEAD_SECONDS", 3600.0)  # no re-read on a slow machine
    await _submit(pg, 100)
    first = await _claim(pg, 10)
    await _claim(pg, 10)  # reads the head: past every run of ``first``
    given = first[0]
    await pg.give_back("w1", [Lease(given.id, given.attempt)])
    head = _head(pg)
    # Within the head's second the run sits before it: the next claim does not see it...
    within = await _claim(pg, 10)
    assert given.id not in [run.id for run in within]
    # ...the next head read does, and it goes first.
    head._read_at = -math.inf  # type: ignore[attr-defined]
    after = await _claim(pg, 10)
    assert after[0].id == given.id


async def test_a_short_claim_sees_the_whole_queue(
    pg: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(head_module, "HEAD_SECONDS", 3600.0)
    await _submit(pg, 30)
    first = await _claim(pg, 10)
    await _claim(pg, 10)
    given = first[0]
    await pg.give_back("w1", [Lease(given.id, given.attempt)])
    # 10 before the head left, plus the run given back behind it: asking for 20 comes back
    # short from the head, and the rest comes from the start of the queue.
    last = await _claim(pg, 20)
    assert given.id in [run.id for run in last]
    assert len(last) == 11
    assert not _head(pg).backlog  # type: ignore[attr-defined]
