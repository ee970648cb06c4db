"""The store conformance suite, sealing at rest: no plaintext in sealed columns, values bound
to their column and run, key rotation.
"""

from __future__ import annotations

from typing import Any

import pytest
from conformance_support import (
    get,
    store,
)
from conftest import (
    TEST_KEY,
)
from factories import (
    StoreHandle,
    engine_ready,
    handle,
    make_run,
    new_run,
    submit,
)

from runq.errors import (
    SealError,
)
from runq.model import (
    Completion,
    Resume,
    Run,
    Status,
)
from runq.seal import KeyRing, key_id_of, sealed_key_id

pytestmark = pytest.mark.anyio

__all__ = ["engine_ready", "handle", "store"]  # fixtures used by name


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
