"""The PostgreSQL store on a cluster (private clusters, tests/pgcluster.py): it connects to
the writable primary whatever the order of the URL's hosts, follows a promoted standby,
leaves a server that stops taking writes (SQLSTATE 25006) for the next writable one
without failing the write, keeps its LISTEN connection on the primary, and reports what an
acknowledgement survives (none, asynchronous, synchronous replication)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import anyio
import pytest
from helpers import ordered_run_id, wait_for
from pgcluster import PgCluster, PgClusterFactory, multi_host_url

from runq.errors import StoreUnavailable
from runq.metrics import STORE_FAILOVERS
from runq.model import NewRun
from runq.seal import KeyRing
from runq.store.postgres import PostgresStore
from runq.store.replication import ReplicationMode

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

SCHEMA = "runq"


def new() -> NewRun:
    return NewRun(component_type="task", component_id="echo", payload={}, id=ordered_run_id())


@pytest.fixture
async def opened() -> AsyncIterator[list[PostgresStore]]:
    """Stores the test opens (``open_store``), closed afterwards."""
    stores: list[PostgresStore] = []
    yield stores
    for store in stores:
        await store.close()


async def open_store(url: str, opened: list[PostgresStore], migrate: bool = True) -> PostgresStore:
    store = PostgresStore(url, schema=SCHEMA, sealer=KeyRing([bytes(range(32))]))
    opened.append(store)
    await store.connect()
    if migrate:
        await store.migrate()
    return store


def failovers() -> float:
    return STORE_FAILOVERS._value.get()  # type: ignore[attr-defined, no-any-return]


async def submits(store: PostgresStore) -> bool:
    try:
        await store.submit(new(), max_queue_depth=0)
    except StoreUnavailable:
        return False
    return True


async def test_the_store_writes_to_the_primary_whichever_host_the_url_names_first(
    pg_clusters: PgClusterFactory, opened: list[PostgresStore]
) -> None:
    primary = await pg_clusters.start()
    standby = await primary.add_standby()
    store = await open_store(multi_host_url(standby, primary), opened)
    await store.submit(new(), max_queue_depth=0)
    await store.ping()
    assert store.server == primary.address
    report = await store.replication()
    assert report.server == primary.address
    assert report.mode is ReplicationMode.ASYNCHRONOUS
    assert [(s.name, s.sync_state) for s in report.standbys] == [(standby.name, "async")]


async def test_the_store_follows_a_promoted_standby_without_a_restart(
    pg_clusters: PgClusterFactory, opened: list[PostgresStore], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="runq")
    primary = await pg_clusters.start()
    standby = await primary.add_standby()
    # Synchronous: what was acknowledged before the kill is on the standby for sure.
    await primary.set_synchronous(standby)
    await primary.wait_streaming(standby, sync=True)
    store = await open_store(multi_host_url(primary, standby), opened)
    assert await store.claim("w", 1, deployment_id=None) == []  # opens the claim connections
    await store.submit(new(), max_queue_depth=0)
    before = failovers()

    await primary.kill()
    # No writable server: unavailable (a 503 upstream), never a write to the standby.
    with pytest.raises(StoreUnavailable):
        await store.submit(new(), max_queue_depth=0)
    await standby.promote()
    await wait_for(lambda: submits(store), timeout=30, message="writes on the new primary")
    claimed = await store.claim("w", 10, deployment_id=None)
    assert len(claimed) == 2, "the claim connections moved as well"

    assert store.server == standby.address
    assert failovers() == before + 1
    moved = [r for r in caplog.records if r.getMessage() == "store.primary_changed"]
    assert len(moved) == 1
    assert (await store.replication()).mode is ReplicationMode.NONE
    assert await store.count_runs() == 2


async def fenced_pair(
    pg_clusters: PgClusterFactory, opened: list[PostgresStore]
) -> tuple[PgCluster, PgCluster, PostgresStore]:
    """Two independent primaries with the schema, and a store on ``a,b`` writing to a."""
    a, b = await pg_clusters.start(), await pg_clusters.start()
    await open_store(b.url, opened)  # migrates b
    store = await open_store(multi_host_url(a, b), opened)
    await store.submit(new(), max_queue_depth=0)
    assert store.server == a.address
    return a, b, store


async def test_a_write_refused_by_a_read_only_server_is_made_on_the_next_primary(
    pg_clusters: PgClusterFactory, opened: list[PostgresStore], caplog: pytest.LogCaptureFixture
) -> None:
    """What a fenced or demoted primary does to a pooled connection: the write fails with
    25006. The store drops its connections and the write, which certainly did not
    happen, is made once more on a fresh connection, which lands on the writable one."""
    caplog.set_level(logging.INFO, logger="runq")
    a, b, store = await fenced_pair(pg_clusters, opened)
    await a.configure(default_transaction_read_only="on")
    before = failovers()

    async def moved() -> bool:
        # No error reaches the caller: each write is made on a (until its session has
        # read the new setting) or refused there and made on b.
        assert (await store.submit(new(), max_queue_depth=0)).created
        return store.server == b.address

    await wait_for(moved, timeout=10, message="the store moved to b")
    assert failovers() == before + 1
    assert await b.fetchval(f"SELECT count(*) FROM {SCHEMA}.runs") == 1
    lost = [r for r in caplog.records if r.getMessage() == "store.primary_lost"]
    assert len(lost) == 1


async def test_readiness_refuses_a_server_that_stopped_taking_writes(
    pg_clusters: PgClusterFactory, opened: list[PostgresStore]
) -> None:
    primary = await pg_clusters.start()
    store = await open_store(primary.url, opened)
    await store.ping()
    await primary.configure(default_transaction_read_only="on")
    with pytest.raises(StoreUnavailable, match="takes writes"):
        await store.ping()
    await primary.configure(default_transaction_read_only="off")
    await store.ping()


async def test_the_listener_moves_to_the_server_that_takes_writes(
    pg_clusters: PgClusterFactory, opened: list[PostgresStore]
) -> None:
    """Its keepalive finds its server read-only: it reconnects to the writable one and a
    NOTIFY there reaches it."""
    a, b, store = await fenced_pair(pg_clusters, opened)
    wakes: list[float] = []
    notifications = store.notifications()
    notifications.subscribe(lambda: wakes.append(anyio.current_time()), lambda _run_id: None)
    async with anyio.create_task_group() as tg:
        await tg.start(notifications.listen)
        listener = notifications.listener
        assert listener is not None
        assert listener.connected
        await a.configure(default_transaction_read_only="on")
        await wait_for(
            lambda: listener.reconnects == 1 and listener.connected,
            timeout=30,
            message="the listener reconnected",
        )
        before = len(wakes)  # the reconnect's own wake-up is not the proof
        await b.execute(f"SELECT pg_notify('{store.channel}', 'wake')")
        await wait_for(lambda: len(wakes) > before, timeout=5, message="NOTIFY on b heard")
        tg.cancel_scope.cancel()
    assert store.server == b.address


@pytest.mark.parametrize("mode", ["none", "asynchronous", "synchronous"])
async def test_the_replication_mode_is_read_from_the_server(
    pg_clusters: PgClusterFactory, opened: list[PostgresStore], mode: str
) -> None:
    primary = await pg_clusters.start()
    if mode != "none":
        standby = await primary.add_standby()
    if mode == "synchronous":
        await primary.set_synchronous(standby)
        await primary.wait_streaming(standby, sync=True)
    store = await open_store(primary.url, opened)
    report = await store.replication()
    assert report.mode.value == mode
    assert report.synchronous_commit == "on"  # what runq's own sessions commit with
    if mode == "synchronous":
        assert report.synchronous_standbys == 1
        assert "loses none" in report.guarantee
        await standby.stop("fast")

        async def gone() -> bool:
            return not (await store.replication()).standbys

        await wait_for(gone, timeout=30, message="the standby left pg_stat_replication")
        waiting = await store.replication()
        assert waiting.mode is ReplicationMode.SYNCHRONOUS  # commits wait: nothing is lost
        assert "no synchronous standby connected" in waiting.guarantee


async def test_a_listen_url_reaching_the_same_server_another_way_is_no_failover(
    pg_clusters: PgClusterFactory, opened: list[PostgresStore]
) -> None:
    """Through a Unix socket the server's address reads differently than over TCP (as
    behind a PgBouncer on the database host): the two routes are never compared."""
    primary = await pg_clusters.start()
    store = PostgresStore(
        primary.url,
        schema=SCHEMA,
        sealer=KeyRing([bytes(range(32))]),
        listen_url=f"postgresql://postgres@/postgres?host={primary.socket_dir}&port={primary.port}",
    )
    opened.append(store)
    await store.connect()
    await store.migrate()
    before = failovers()
    connector = store.listen_connector()
    assert connector is not None
    conn = await connector.connect()
    try:
        await connector.check(conn)
        await store.submit(new(), max_queue_depth=0)
    finally:
        await conn.close()
    assert failovers() == before
    assert store.server == primary.address
