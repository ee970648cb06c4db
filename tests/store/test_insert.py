"""The store conformance suite, submissions: every field stored, idempotency keys, the depth
gates and bulk inserts.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from conformance_support import (
    claim,
    get,
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
from helpers import ordered_run_id

from runq.errors import (
    BadRequest,
    Conflict,
    IdempotencyConflict,
    InvalidPayload,
    QueueFull,
)
from runq.model import (
    Actor,
    Status,
)
from runq.store.base import Store

pytestmark = pytest.mark.anyio

__all__ = ["engine_ready", "handle", "store"]  # fixtures used by name


# =========================================================================================
# submit
# =========================================================================================


async def test_submit_stores_every_field(store: Store) -> None:
    actor = Actor(user_id="u-1", service_account=False, scopes=("runq:approve", "x"))
    payload = {"text": "héllo ✓", "n": [1, 2.5, None, True], "nested": {"a": {"b": "c"}}}
    before = await store.now()
    result = await store.submit(
        new_run(
            component_type="agent",
            component_id="summarize",
            payload=payload,
            session_id="s-1",
            actor=actor,
            configuration="cfg-a",
            idempotency_key="key-1",
            max_attempts=3,
            deployment_id="gpu",
            priority=-2,
            origin="http",
        ),
        max_queue_depth=0,
    )
    after = await store.now()
    run = result.run
    assert result.created is True
    assert run.status is Status.QUEUED
    assert (run.component_type, run.component_id) == ("agent", "summarize")
    assert run.component == "agent/summarize"
    assert run.payload == payload
    assert run.session_id == "s-1"
    assert run.user_id == "u-1"
    assert run.actor == actor
    assert run.configuration == "cfg-a"
    assert run.idempotency_key == "key-1"
    assert run.attempt == 0
    assert run.max_attempts == 3
    assert run.deployment_id == "gpu"
    assert run.priority == -2
    assert run.origin == "http"
    assert before - 0.01 <= run.created_at <= after + 0.01
    assert run.updated_at == pytest.approx(run.created_at, abs=0.5)
    assert run.available_at == pytest.approx(run.created_at, abs=0.5)
    assert run.started_at is None
    assert run.completed_at is None
    assert run.locked_by is None
    assert run.locked_at is None
    assert run.error is None
    assert run.termination_reason is None
    assert run.pause_reason is None
    assert run.cancel_requested is False
    assert run.non_idempotent is False
    assert run.has_request is True
    assert run.answer is None
    assert run.resume is None
    assert (run.tokens, run.cost) == (0, 0.0)
    assert await store.get(run.id) == run


async def test_submit_without_id_generates_a_uuid7(store: Store) -> None:

    run = await submit(store, id=None)
    assert uuid.UUID(run.id).version == 7
    assert str(uuid.UUID(run.id)) == run.id
    other = await submit(store, id=None)
    assert other.id != run.id


async def test_submit_keeps_a_given_id(store: Store) -> None:
    rid = ordered_run_id()
    run = await submit(store, id=rid)
    assert run.id == rid
    assert (await get(store, rid)).id == rid


async def test_get_unknown_is_none(store: Store) -> None:
    assert await store.get(ordered_run_id()) is None


async def test_no_deployment_is_empty_string_in_db_and_none_in_model(
    handle: StoreHandle,
) -> None:
    run = await submit(handle.store, deployment_id=None)
    assert run.deployment_id is None
    assert (await get(handle.store, run.id)).deployment_id is None
    assert (await handle.raw_row(run.id))["deployment_id"] == ""


async def test_save_request_false_keeps_no_payload(handle: StoreHandle) -> None:
    run = await submit(handle.store, payload={"secret": 1}, save_request=False)
    assert run.has_request is False
    assert run.payload is None
    got = await get(handle.store, run.id)
    assert (got.has_request, got.payload) == (False, None)
    assert (await handle.raw_row(run.id))["payload"] is None


async def test_payload_none_is_a_saved_request(store: Store) -> None:
    run = await submit(store, payload=None)
    got = await get(store, run.id)
    assert got.has_request is True
    assert got.payload is None


@pytest.mark.parametrize(
    "payload",
    [{"x": object()}, [1, complex(1, 2)], {"call": print}],
    ids=["object", "complex", "function"],
)
async def test_invalid_payload_stores_nothing(store: Store, payload: Any) -> None:
    with pytest.raises(InvalidPayload):
        await store.submit(new_run(payload=payload, idempotency_key="k"), max_queue_depth=0)
    assert await store.count_runs() == 0
    # The key was not consumed by the refused submission.
    result = await store.submit(new_run(payload={"ok": 1}, idempotency_key="k"), max_queue_depth=0)
    assert result.created is True
    assert issubclass(InvalidPayload, BadRequest)


async def test_submit_many_with_an_invalid_payload_stores_nothing(store: Store) -> None:
    with pytest.raises(InvalidPayload):
        await store.submit_many([new_run(payload={"ok": 1}), new_run(payload={"x": object()})])
    assert await store.count_runs() == 0


# -- idempotency ------------------------------------------------------------------------


async def test_same_key_same_user_returns_the_same_run(store: Store) -> None:
    first = await store.submit(new_run(idempotency_key="k1", user_id="u1"), max_queue_depth=0)
    again = await store.submit(
        new_run(idempotency_key="k1", user_id="u1", payload={"different": True}),
        max_queue_depth=0,
    )
    assert first.created is True
    assert again.created is False
    assert again.run.id == first.run.id
    assert again.run.payload == first.run.payload
    assert await store.count_runs() == 1


async def test_same_key_without_user_is_deduplicated(store: Store) -> None:
    first = await store.submit(new_run(idempotency_key="k1"), max_queue_depth=0)
    again = await store.submit(new_run(idempotency_key="k1"), max_queue_depth=0)
    assert (again.created, again.run.id) == (False, first.run.id)


async def test_same_key_other_user_is_a_new_run(store: Store) -> None:
    a = await store.submit(new_run(idempotency_key="k1", user_id="u1"), max_queue_depth=0)
    b = await store.submit(new_run(idempotency_key="k1", user_id="u2"), max_queue_depth=0)
    c = await store.submit(new_run(idempotency_key="k1"), max_queue_depth=0)
    assert (a.created, b.created, c.created) == (True, True, True)
    assert len({a.run.id, b.run.id, c.run.id}) == 3
    assert await store.count_runs() == 3


async def test_same_key_other_component_is_an_idempotency_conflict(store: Store) -> None:
    await store.submit(new_run(idempotency_key="k1", user_id="u1"), max_queue_depth=0)
    with pytest.raises(IdempotencyConflict):
        await store.submit(
            new_run(idempotency_key="k1", user_id="u1", component_id="other"),
            max_queue_depth=0,
        )
    with pytest.raises(IdempotencyConflict):
        await store.submit(
            new_run(idempotency_key="k1", user_id="u1", component_type="agent"),
            max_queue_depth=0,
        )
    assert issubclass(IdempotencyConflict, Conflict)
    assert await store.count_runs() == 1


async def test_duplicate_is_answered_even_when_the_queue_is_full(store: Store) -> None:
    first = await store.submit(new_run(idempotency_key="k1", user_id="u1"), max_queue_depth=1)
    again = await store.submit(new_run(idempotency_key="k1", user_id="u1"), max_queue_depth=1)
    assert (again.created, again.run.id) == (False, first.run.id)
    with pytest.raises(QueueFull):
        await store.submit(new_run(idempotency_key="k2", user_id="u1"), max_queue_depth=1)


async def test_key_stays_used_after_the_run_finished(store: Store) -> None:
    done = await make_run(store, Status.COMPLETED, idempotency_key="k1", user_id="u1")
    again = await store.submit(new_run(idempotency_key="k1", user_id="u1"), max_queue_depth=0)
    assert (again.created, again.run.id, again.run.status) == (False, done.id, Status.COMPLETED)


# -- depth gate -------------------------------------------------------------------------


async def test_queue_full_at_max_queue_depth(store: Store) -> None:
    for _ in range(3):
        await store.submit(new_run(), max_queue_depth=3)
    with pytest.raises(QueueFull):
        await store.submit(new_run(), max_queue_depth=3)
    assert await store.count_runs() == 3
    # Only queued runs count: claiming one makes room for exactly one more.
    assert len(await claim(store, slots=1)) == 1
    await store.submit(new_run(), max_queue_depth=3)
    with pytest.raises(QueueFull):
        await store.submit(new_run(), max_queue_depth=3)


async def test_delayed_runs_have_their_own_bound(store: Store) -> None:
    # Delayed runs never fill the due queue; they are gated by max_delayed instead.
    await store.submit(new_run(delay_seconds=100), max_queue_depth=1, max_delayed=1)
    await store.submit(new_run(), max_queue_depth=1, max_delayed=1)
    with pytest.raises(QueueFull):
        await store.submit(new_run(), max_queue_depth=1)
    with pytest.raises(QueueFull):
        await store.submit(new_run(delay_seconds=100), max_queue_depth=1, max_delayed=1)


async def test_queued_runs_per_user_are_bounded(store: Store) -> None:
    await store.submit(new_run(user_id="u"), max_queue_depth=0, max_queued_per_user=1)
    with pytest.raises(QueueFull):
        await store.submit(new_run(user_id="u"), max_queue_depth=0, max_queued_per_user=1)
    await store.submit(new_run(user_id="v"), max_queue_depth=0, max_queued_per_user=1)


async def test_depth_zero_is_unbounded(store: Store) -> None:
    for _ in range(5):
        await store.submit(new_run(), max_queue_depth=0)
    assert await store.count_runs() == 5


# -- bulk -------------------------------------------------------------------------------


async def test_submit_many_inserts_queued_runs_in_order(store: Store) -> None:
    news = [new_run(payload={"i": i}, priority=i % 3, user_id=f"u{i}") for i in range(50)]
    got_ids = await store.submit_many(news)
    assert got_ids == [n.id for n in news]
    assert await store.count_runs() == 50
    for i, rid in enumerate(got_ids):
        run = await get(store, rid)
        assert run.status is Status.QUEUED
        assert run.attempt == 0
        assert run.payload == {"i": i}
        assert run.priority == i % 3
        assert run.user_id == f"u{i}"
    assert await store.submit_many([]) == []


async def test_submit_many_generates_ids_when_none_given(store: Store) -> None:
    got_ids = await store.submit_many([new_run(id=None) for _ in range(10)])
    assert len(set(got_ids)) == 10
    assert await store.count_runs() == 10
