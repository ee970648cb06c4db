"""``Queue.defer_many`` and ``Store.submit_batch`` on both engines: all or nothing, the
single submit's idempotency, uniqueness and depth rules per item, and a batch of 10,000."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from conftest import PG_URL, drop_schema, new_schema_name, require_postgres

from runq import Queue
from runq.config import Config, QueueConfig, SealConfig, StoreConfig
from runq.errors import BadRequest, Conflict, IdempotencyConflict, InvalidPayload, QueueFull
from runq.model import Actor, Status
from runq.seal import generate_key


def _config(engine: str, tmp_path: Path, schema: str, **queue: object) -> Config:
    url = PG_URL if engine == "postgres" else f"sqlite:///{tmp_path / 'runq.db'}"
    key_file = tmp_path / "seal.key"
    if not key_file.exists():
        key_file.write_text(generate_key())
    return Config(
        store=StoreConfig(url=url, schema=schema),
        queue=QueueConfig(**queue),  # type: ignore[arg-type]
        seal=SealConfig(keys=(f"file:{key_file}",)),
    )


Opener = Callable[..., AbstractAsyncContextManager[Queue]]


async def queued(q: Queue) -> int:
    return (await q.store.stats()).counts.get("queued", 0)


@pytest.fixture
async def open_queue(engine: str, tmp_path: Path) -> AsyncIterator[Opener]:
    """A factory: ``async with open_queue(**queue_options) as q`` on the test's engine."""
    schema = "runq"
    if engine == "postgres":
        require_postgres()
        schema = new_schema_name()

    def opener(**queue: object) -> AbstractAsyncContextManager[Queue]:
        return Queue.open(config=_config(engine, tmp_path, schema, **queue))

    yield opener
    if engine == "postgres":
        await drop_schema(schema)


async def test_defer_many_stores_ten_thousand_runs_in_order(open_queue: Opener) -> None:
    async with open_queue(max_queue_depth=20_000) as q:
        items = [q.new_run("task", "echo", {"i": i}, timeout_seconds=5) for i in range(10_000)]
        started = time.perf_counter()
        results = await q.defer_many(items)
        elapsed = time.perf_counter() - started
        assert len(results) == 10_000
        assert all(r.created for r in results)
        assert [r.run.payload for r in results[:3]] == [{"i": 0}, {"i": 1}, {"i": 2}]
        assert await queued(q) == 10_000
        stored = await q.get(results[9_999].run.id)
        assert stored is not None
        assert stored.payload == {"i": 9_999}
        assert stored.timeout_seconds == 5
        # A bound, not a benchmark: one transaction, not 10,000 round trips.
        assert elapsed < 20, f"defer_many of 10,000 runs took {elapsed:.1f}s"


async def test_an_existing_idempotency_key_answers_with_its_run(open_queue: Opener) -> None:
    async with open_queue() as q:
        first = await q.defer("task", "echo", {"n": 1}, idempotency_key="k1")
        results = await q.defer_many(
            [
                q.new_run("task", "echo", {"n": 2}, idempotency_key="k1"),
                q.new_run("task", "echo", {"n": 3}, idempotency_key="k2"),
                q.new_run("task", "echo", {"n": 4}, idempotency_key="k2"),
                q.new_run("task", "echo", {"n": 5}),
            ]
        )
        assert [r.created for r in results] == [False, True, False, True]
        assert results[0].run.id == first.run.id
        assert results[0].run.payload == {"n": 1}
        assert results[2].run.id == results[1].run.id
        assert await queued(q) == 3


async def test_keys_are_per_user(open_queue: Opener) -> None:
    async with open_queue() as q:
        results = await q.defer_many(
            [
                q.new_run("task", "echo", idempotency_key="k", actor=Actor(user_id="ann")),
                q.new_run("task", "echo", idempotency_key="k", actor=Actor(user_id="bob")),
            ]
        )
        assert [r.created for r in results] == [True, True]


async def test_a_key_of_another_component_refuses_the_whole_batch(open_queue: Opener) -> None:
    async with open_queue() as q:
        await q.defer("task", "echo", idempotency_key="taken")
        with pytest.raises(IdempotencyConflict, match="taken"):
            await q.defer_many(
                [
                    q.new_run("task", "echo", {"n": 1}),
                    q.new_run("task", "sleep", idempotency_key="taken"),
                ]
            )
        assert await queued(q) == 1


async def test_a_bad_payload_stores_nothing(open_queue: Opener) -> None:
    async with open_queue() as q:
        with pytest.raises(InvalidPayload):
            await q.defer_many(
                [q.new_run("task", "echo", {"ok": 1}), q.new_run("task", "echo", {"x": object()})]
            )
        assert await queued(q) == 0


async def test_the_depth_gate_must_fit_the_whole_batch(open_queue: Opener) -> None:
    async with open_queue(max_queue_depth=10) as q:
        await q.defer_many([q.new_run("task", "echo") for _ in range(7)])
        with pytest.raises(QueueFull, match=r"7 due runs are queued, the batch adds 4"):
            await q.defer_many([q.new_run("task", "echo") for _ in range(4)])
        assert await queued(q) == 7
        # Duplicates add nothing, so they do not count against the gate.
        dup = [q.new_run("task", "echo", idempotency_key="d") for _ in range(5)]
        assert [r.created for r in await q.defer_many(dup)] == [True] + [False] * 4
        assert len(await q.defer_many([q.new_run("task", "echo") for _ in range(2)])) == 2
        assert await queued(q) == 10


async def test_delayed_and_per_user_gates(open_queue: Opener) -> None:
    async with open_queue(max_delayed=3, max_queued_per_user=2) as q:
        with pytest.raises(QueueFull, match="max_delayed"):
            await q.defer_many([q.new_run("task", "echo", delay_seconds=60) for _ in range(4)])
        ann = Actor(user_id="ann")
        with pytest.raises(QueueFull, match="max_queued_per_user"):
            await q.defer_many([q.new_run("task", "echo", actor=ann) for _ in range(3)])
        assert await queued(q) == 0
        both = [q.new_run("task", "echo", actor=Actor(user_id=u)) for u in ("ann", "ann", "bo")]
        assert len(await q.defer_many(both)) == 3


async def test_unique_keys_hold_across_and_inside_the_batch(open_queue: Opener) -> None:
    async with open_queue() as q:
        held = await q.defer("task", "echo", unique_key="u1")
        results = await q.defer_many(
            [
                q.new_run("task", "echo", unique_key="u1"),
                q.new_run("task", "echo", unique_key="u2"),
                q.new_run("task", "echo", unique_key="u2"),
            ]
        )
        assert [r.created for r in results] == [False, True, False]
        assert results[0].run.id == held.run.id
        assert results[2].run.id == results[1].run.id
        # The lock row names the batch's run: a later single submit finds it.
        again = await q.defer("task", "echo", unique_key="u2")
        assert not again.created
        assert again.run.id == results[1].run.id


async def test_sealing_holds_for_batch_runs(open_queue: Opener) -> None:
    async with open_queue() as q:
        [result] = await q.defer_many([q.new_run("task", "echo", {"secret": "s3"})])
        stored = await q.get(result.run.id)
        assert stored is not None
        assert stored.payload == {"secret": "s3"}
        assert stored.status is Status.QUEUED


async def test_timeout_seconds_is_bounded_by_the_config(open_queue: Opener) -> None:
    async with open_queue(max_timeout_seconds=60) as q:
        with pytest.raises(BadRequest, match=r"max_timeout_seconds"):
            q.new_run("task", "echo", timeout_seconds=61)
        with pytest.raises(BadRequest, match=r"timeout_seconds"):
            q.new_run("task", "echo", timeout_seconds=0)
        run = (await q.defer("task", "echo", timeout_seconds=60)).run
        stored = await q.get(run.id)
        assert stored is not None
        assert stored.timeout_seconds == 60
        plain = await q.get((await q.defer("task", "echo")).run.id)
        assert plain is not None
        assert plain.timeout_seconds is None


async def test_every_run_of_a_batch_gets_its_submitted_event(open_queue: Opener) -> None:
    """Every run of a batch lists exactly one `submitted` event, seq 1, at its created_at
    (PostgreSQL: the run row itself, nothing stored; SQLite: a trigger's row); a duplicate
    answered from a stored run gets none."""
    async with open_queue() as q:
        items = [q.new_run("task", "echo", {"i": i}, idempotency_key=f"k{i}") for i in range(3)]
        first = await q.defer_many(items)
        again = await q.defer_many([*items[:1], q.new_run("task", "echo", {"i": 3})])
        assert [r.created for r in again] == [False, True]
        for result in [*first, again[1]]:
            events = await q.store.list_events(result.run.id, after=0, limit=10)
            assert [(e.seq, e.kind, e.attempt) for e in events] == [(1, "submitted", 0)]
            assert events[0].at == result.run.created_at


async def test_a_key_refused_in_a_late_chunk_stores_nothing_and_the_pool_goes_on(
    open_queue: Opener,
) -> None:
    """PostgreSQL writes a batch as several COPYs (chunks of ``COPY_CHUNK``): the unique
    index refusing a row of the last chunk rolls back the chunks before it, and the
    connection is fit for the next batch. ``submit_many`` plans nothing, so the second use
    of the key reaches the index."""
    async with open_queue() as q:
        items = [q.new_run("task", "echo", {"i": i}) for i in range(1_000)]
        items[10] = q.new_run("task", "echo", {"i": 10}, idempotency_key="twice")
        items[990] = q.new_run("task", "echo", {"i": 990}, idempotency_key="twice")
        with pytest.raises(Conflict):
            await q.store.submit_many(items)
        assert await queued(q) == 0
        for _ in range(3):  # every pooled connection, whichever one took the failure
            ids = await q.store.submit_many(
                [q.new_run("task", "echo", {"i": i}) for i in range(600)]
            )
            assert len(ids) == 600
        assert await queued(q) == 1_800
