"""Store rules a newcomer runs into early, on both engines: a pasted id prefix resolves to
the runs it names, and continuing a paused run never lowers its attempt limit."""

from __future__ import annotations

import pytest
from factories import make_run, submit

from runq.model import Status
from runq.store.base import Store

pytestmark = pytest.mark.anyio


async def test_ids_with_prefix_finds_exactly_the_runs_that_start_with_it(store: Store) -> None:
    ids = ["abc-1", "abc-2", "abd-1", "ab", "xabc"]
    for run_id in ids:
        await submit(store, id=run_id)

    assert await store.run_ids_with_prefix("abc", limit=10) == ["abc-1", "abc-2"]
    assert await store.run_ids_with_prefix("ab", limit=10) == ["ab", "abc-1", "abc-2", "abd-1"]
    assert await store.run_ids_with_prefix("ab", limit=2) == ["ab", "abc-1"]
    assert await store.run_ids_with_prefix("abd-1", limit=10) == ["abd-1"]
    assert await store.run_ids_with_prefix("zz", limit=10) == []
    # Pattern characters are plain text, never wildcards.
    assert await store.run_ids_with_prefix("a%", limit=10) == []
    assert await store.run_ids_with_prefix("a_c", limit=10) == []


async def test_continue_keeps_the_attempts_a_run_had_left(store: Store) -> None:
    paused = await make_run(store, Status.PAUSED, attempt=1, max_attempts=3)
    continued = await store.continue_(paused.id, {"approved": True})
    assert continued.status is Status.QUEUED
    assert continued.max_attempts == 3, "a continue must not lower the limit"


async def test_continue_of_a_run_on_its_last_attempt_still_gets_one_more(store: Store) -> None:
    paused = await make_run(store, Status.PAUSED, attempt=2, max_attempts=2)
    continued = await store.continue_(paused.id, None)
    assert continued.max_attempts == 3
