"""``Store.list_runs`` and the filtered ``list_jobs`` on both engines: the SQL filters,
the owner rule for service accounts, LIKE escaping, and keyset cursors over ties."""

from __future__ import annotations

import pytest
from factories import new_run, submit

from runq.listing import RunCursor, RunFilter
from runq.model import Actor, Status
from runq.store.base import Store

pytestmark = pytest.mark.anyio


async def _ids(store: Store, where: RunFilter, limit: int = 1000) -> list[str]:
    """Every page of ``list_runs``, newest first, following the cursor."""
    ids: list[str] = []
    after: RunCursor | None = None
    while True:
        page = await store.list_runs(where, after=after, limit=limit)
        ids += [run.id for run in page.data]
        if page.next_cursor is None:
            return ids
        after = RunCursor.decode(page.next_cursor)


async def test_owner_excludes_service_account_runs(store: Store) -> None:
    person = await submit(store, user_id="alice")
    robot = Actor(user_id="alice", service_account=True)
    await submit(store, actor=robot, user_id="alice")
    await submit(store, user_id="bob")
    assert await _ids(store, RunFilter(owner="alice")) == [person.id]
    every_alice = await _ids(store, RunFilter(user_id="alice"))
    assert len(every_alice) == 2


async def test_component_patterns_escape_like_wildcards(store: Store) -> None:
    plain = await submit(store, component_id="a_b")
    other = await submit(store, component_id="axb")
    percent = await submit(store, component_id="100%")
    agent = await submit(store, component_type="agent", component_id="a_b")
    assert await _ids(store, RunFilter(component="task/a_b")) == [plain.id]
    assert await _ids(store, RunFilter(component="task/a_*")) == [plain.id]
    assert await _ids(store, RunFilter(component="task/a*")) == [other.id, plain.id]
    assert await _ids(store, RunFilter(component="task/100%")) == [percent.id]
    assert await _ids(store, RunFilter(component="agent/*")) == [agent.id]
    assert len(await _ids(store, RunFilter(component="*"))) == 4


async def test_filters_combine(store: Store) -> None:
    first = await submit(store, session_id="s", deployment_id="blue")
    await submit(store, session_id="s")
    await submit(store, deployment_id="blue")
    both = RunFilter(session_id="s", deployment_id="blue", statuses=(Status.QUEUED,))
    assert await _ids(store, both) == [first.id]
    assert await _ids(store, RunFilter(statuses=(Status.FAILED,))) == []
    page = await store.list_jobs(where=RunFilter(deployment_id="blue", statuses=(Status.QUEUED,)))
    assert page.total_count == 2


async def test_cursor_pages_through_ties_without_gaps(store: Store) -> None:
    # One bulk insert shares one created_at: only the id orders these rows.
    ids = await store.submit_many([new_run() for _ in range(25)])
    later = await submit(store)
    seen = await _ids(store, RunFilter(), limit=4)
    assert seen[0] == later.id
    assert sorted(seen[1:]) == sorted(ids)
    assert seen[1:] == sorted(ids, reverse=True)
    first = await store.get(ids[0])
    assert first is not None
    # created_after is inclusive and created_before exclusive (the clock may give the later
    # run the batch's time, so the bounds are taken at the batch's own time).
    assert await _ids(store, RunFilter(created_before=first.created_at)) == []
    assert await _ids(store, RunFilter(created_after=first.created_at), limit=7) == seen


async def test_list_jobs_cursor_in_both_orders(store: Store) -> None:
    ids = [(await submit(store)).id for _ in range(5)]
    for order, expected in (("asc", ids), ("desc", ids[::-1])):
        page = await store.list_jobs(limit=2, sort_order=order)
        seen = [run.id for run in page.data]
        while page.next_cursor is not None:
            after = RunCursor.decode(page.next_cursor)
            page = await store.list_jobs(limit=2, sort_order=order, after=after)
            seen += [run.id for run in page.data]
        assert seen == expected
    by_priority = await store.list_jobs(limit=2, sort_by="priority")
    assert by_priority.next_cursor is None


def test_a_cursor_is_opaque_and_checked() -> None:
    cursor = RunCursor(1767225600.123456, "0190f1c2-0000-7000-8000-000000000000")
    assert RunCursor.decode(cursor.encode()) == cursor
    for bad in ("", "x", "bm90IGpzb24", RunCursor(float("inf"), "a").encode(), "a" * 5000):
        with pytest.raises(ValueError, match="cursor"):
            RunCursor.decode(bad)
