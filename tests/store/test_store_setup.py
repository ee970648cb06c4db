"""The store conformance suite, connecting, migrating, the database clock and run ids, on both
engines.
"""

from __future__ import annotations

import itertools
import time
import uuid
from pathlib import Path

import pytest
from conformance_support import (
    fresh_location,
    migration_count,
    store,
)
from conftest import (
    drop_schema,
)
from factories import (
    StoreHandle,
    engine_ready,
    handle,
    submit,
)
from helpers import gather

from runq.errors import (
    StoreUnavailable,
)
from runq.ids import new_run_id, new_run_ids
from runq.seal import KeyRing
from runq.store import make_store
from runq.store.base import Store

pytestmark = pytest.mark.anyio

__all__ = ["engine_ready", "handle", "store"]  # fixtures used by name


# =========================================================================================
# lifecycle
# =========================================================================================


async def test_engine_identity_and_capabilities(handle: StoreHandle) -> None:
    store = handle.store
    assert isinstance(store, Store)
    assert store.engine == handle.engine
    assert store.notifications().crosses_processes is (handle.engine == "postgres")
    assert store.clock_offset_seconds == 0.0


async def test_migrate_twice_is_a_noop(store: Store) -> None:
    await submit(store)
    assert await store.migrate() == 0
    assert await store.schema_is_current() is True
    assert await store.count_runs() == 1


async def test_fresh_database_is_not_current_until_migrated(
    engine_ready: str, tmp_path: Path, key_ring: KeyRing
) -> None:
    engine = engine_ready
    url, schema = fresh_location(engine, tmp_path, "fresh.db")
    store = make_store(url, schema=schema, sealer=key_ring)
    await store.connect()
    try:
        assert await store.schema_is_current() is False
        assert await store.migrate() == migration_count(engine)
        assert await store.schema_is_current() is True
        assert await store.migrate() == 0
    finally:
        await store.close()
        if engine == "postgres":
            await drop_schema(schema)


async def test_concurrent_migrate_on_a_fresh_database_is_safe(
    engine_ready: str, tmp_path: Path, key_ring: KeyRing
) -> None:
    engine = engine_ready
    url, schema = fresh_location(engine, tmp_path, "race.db")
    stores = [make_store(url, schema=schema, sealer=key_ring) for _ in range(4)]
    try:
        for s in stores:
            await s.connect()
        applied = await gather(*(s.migrate() for s in stores))
        assert sum(applied) == migration_count(engine), applied
        for s in stores:
            assert await s.schema_is_current() is True
        await submit(stores[0])
        assert await stores[3].count_runs() == 1
    finally:
        for s in stores:
            await s.close()
        if engine == "postgres":
            await drop_schema(schema)


async def test_ping_and_count_runs(store: Store) -> None:
    await store.ping()
    assert await store.count_runs() == 0
    await submit(store)
    await submit(store)
    assert await store.count_runs() == 2


async def test_now_is_the_database_clock_plus_offset(store: Store) -> None:
    t0 = await store.now()
    assert abs(t0 - time.time()) < 5, "the database clock of a local test database is near ours"
    store.clock_offset_seconds = 1000.0
    t1 = await store.now()
    assert 1000 - 1 <= t1 - t0 <= 1000 + 5
    store.clock_offset_seconds = -50.0
    t2 = await store.now()
    assert -51 <= t2 - t0 <= -50 + 5


@pytest.mark.timeout(60)
async def test_unreachable_postgres_raises_store_unavailable_without_password(
    key_ring: KeyRing,
) -> None:
    s = make_store(
        "postgresql://postgres:s3cretpw@127.0.0.1:1/test", schema="runq", sealer=key_ring
    )
    with pytest.raises(StoreUnavailable) as excinfo:
        await s.connect()
    message = str(excinfo.value)
    assert "s3cretpw" not in message
    assert "127.0.0.1" in message


async def test_unopenable_sqlite_raises_store_unavailable(
    tmp_path: Path, key_ring: KeyRing
) -> None:
    # The path is a directory: no database can be opened there.
    s = make_store(f"sqlite:///{tmp_path}", schema="runq", sealer=key_ring)

    async def open_and_migrate() -> None:
        await s.connect()
        await s.migrate()

    with pytest.raises(StoreUnavailable):
        await open_and_migrate()
    await s.close()


def test_run_ids_sort_in_creation_order() -> None:
    """Claims break ties and the session rule picks "the oldest" by id (INTERNALS: "id order
    is creation order"), so ids made back to back must sort in the order they were made."""
    made = [new_run_id() for _ in range(2000)]
    assert len(set(made)) == len(made)
    out_of_order = sum(1 for a, b in itertools.pairwise(made) if a > b)
    assert out_of_order == 0, f"{out_of_order} of {len(made)} consecutive ids sort backwards"


def test_ids_made_in_bulk_sort_after_single_ones_and_are_uuid7() -> None:
    """A bulk submit makes its ids in one go (``new_run_ids``): still unique, increasing,
    after every id made before and before every id made after, each a valid UUIDv7."""
    before = new_run_id()
    made = new_run_ids(5000)
    after = new_run_id()
    assert len(set(made)) == len(made)
    assert [before, *made, after] == sorted([before, *made, after])
    assert all(a < b for a, b in itertools.pairwise([before, *made, after]))
    for text in (made[0], made[2500], made[-1]):
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
    assert new_run_ids(0) == []
