"""What an acknowledgement means on a PostgreSQL cluster, as the operator sees it: the start
log and ``runq status`` name the replication mode, and
``[store] require_synchronous_replication`` refuses to start without synchronous commits
(a config error naming the key, exit 2). Private clusters (tests/pgcluster.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pgcluster import PgCluster, PgClusterFactory, multi_host_url
from serve_harness import RunqSetup, database_for, servers_on

pytestmark = [pytest.mark.anyio, pytest.mark.postgres, pytest.mark.daemon]

REQUIRE = {"store": {"require_synchronous_replication": True}}


async def cluster_in_mode(pg_clusters: PgClusterFactory, mode: str) -> list[PgCluster]:
    primary = await pg_clusters.start("pg_a")
    if mode == "none":
        return [primary]
    standby = await primary.add_standby("pg_b")
    if mode == "synchronous":
        await primary.set_synchronous(standby)
        await primary.wait_streaming(standby, sync=True)
    return [primary, standby]


@pytest.fixture(params=["none", "asynchronous", "synchronous"])
async def setup_in_mode(
    request: pytest.FixtureRequest, pg_clusters: PgClusterFactory, tmp_path: Path
) -> AsyncIterator[tuple[str, RunqSetup]]:
    nodes = await cluster_in_mode(pg_clusters, request.param)
    async with database_for("postgres", tmp_path, store_url=multi_host_url(*nodes)) as setup:
        migrated = await setup.cli("migrate")
        assert migrated.returncode == 0, migrated.stderr
        yield request.param, setup


async def test_runq_status_names_the_replication_mode(
    setup_in_mode: tuple[str, RunqSetup],
) -> None:
    mode, setup = setup_in_mode
    done = await setup.cli("status", "--json", "--minimum-workers", "0")
    assert done.returncode == 0, done.stderr
    database = json.loads(done.stdout)["database"]
    assert database["mode"] == mode
    assert database["synchronous_commit"] == "on"
    assert database["server"].endswith(setup.store_url.split("@")[1].split(",")[0].split("/")[0])
    if mode == "none":
        assert database["standbys"] == []
    else:
        sync_state = "sync" if mode == "synchronous" else "async"
        assert database["standbys"] == [
            {"name": "pg_b", "state": "streaming", "sync_state": sync_state}
        ]
    text = await setup.cli("status", "--minimum-workers", "0")
    assert "replication" in text.stdout
    assert mode in text.stdout
    assert "guarantee: " in text.stdout

    # Requiring synchronous replication: unhealthy in any other mode.
    config = setup.write_config(REQUIRE)
    required = await setup.cli("status", "--minimum-workers", "0", config=config)
    assert required.returncode == (0 if mode == "synchronous" else 1), required.stdout


async def test_serve_states_the_mode_at_start_and_refuses_to_start_without_the_required_one(
    setup_in_mode: tuple[str, RunqSetup],
) -> None:
    mode, setup = setup_in_mode
    async with servers_on(setup) as start:
        server = await start(REQUIRE if mode == "synchronous" else {})
        logged = [
            json.loads(entry)
            for entry in server.logs().splitlines()
            if '"store.replication"' in entry
        ]
    assert [line["mode"] for line in logged] == [mode]
    assert logged[0]["guarantee"]
    if mode == "synchronous":
        return  # it started with the requirement
    refused = await setup.cli("serve", config=setup.write_config(REQUIRE), timeout=60)
    assert refused.returncode == 2, refused.stderr
    # The start log says the mode, then one line says why the start is refused.
    errors = [line for line in refused.stderr.splitlines() if line.startswith("runq:")]
    assert len(errors) == 1, refused.stderr
    assert "store.require_synchronous_replication" in errors[0]
    assert ("no standby" if mode == "none" else "asynchronously") in errors[0]
    assert "Traceback" not in refused.stderr
