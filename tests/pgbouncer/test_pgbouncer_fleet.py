"""Three ``runq serve`` replicas through a real PgBouncer in transaction mode.

Every store connection goes through the bouncer (``[store] pgbouncer = true``: no
server-side prepared statements). Two replicas LISTEN on a direct ``listen_url``; the third
has none and polls. ``RUNQ_TEST_PGBOUNCER_URL`` names the bouncer
(``eval "$(bash scripts/start-pgbouncer)"``); without it the fixture runs that script when
Debian's ``pgbouncer`` is installed. Missing PgBouncer skips this test, except under
CI=true, where it fails. Runs submitted in bulk and over HTTP through the bouncer all complete,
each executed once, shared by the replicas.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import anyio
import pytest
from conftest import IN_CI, PG_URL, require_postgres
from helpers import wait_for
from serve_handlers import read_executions
from serve_harness import (  # fixtures are used by name
    RunqSetup,
    ServeFactory,
    api_available,
    pg_ready,
    pg_serve_factory,
    pg_setup,
)

from runq.model import NewRun

pytestmark = [pytest.mark.anyio, pytest.mark.daemon, pytest.mark.postgres]
__all__ = ["pg_ready", "pg_serve_factory", "pg_setup"]

RUNS = 600


REPO_DIR = Path(__file__).resolve().parents[2]


def _installed() -> bool:
    return shutil.which("pgbouncer") is not None or Path("/usr/sbin/pgbouncer").exists()


def _start() -> str:
    out = subprocess.run(
        ["bash", str(REPO_DIR / "scripts" / "start-pgbouncer")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    for line in out.splitlines():
        if line.startswith("export RUNQ_TEST_PGBOUNCER_URL="):
            return line.split("=", 1)[1].strip()
    raise RuntimeError(f"scripts/start-pgbouncer printed no URL: {out!r}")


@pytest.fixture(scope="module")
def pgbouncer_url() -> str:
    require_postgres()
    url = os.environ.get("RUNQ_TEST_PGBOUNCER_URL", "")
    if url:
        return url
    if not _installed():
        reason = "pgbouncer is not installed (scripts/start-pgbouncer installs it)"
        if IN_CI:
            pytest.fail(f"{reason} (CI=true: the PgBouncer tests must run)")
        pytest.skip(reason)
    return _start()


def _bouncer_clients(pgbouncer_url: str) -> int:
    """Client connections PgBouncer holds now, from its admin console (``SHOW CLIENTS``,
    which speaks only the simple query protocol: psql, not asyncpg)."""
    admin = pgbouncer_url.rsplit("/", 1)[0] + "/pgbouncer"
    out = subprocess.run(
        ["psql", admin, "-At", "-F", "|", "-c", "SHOW CLIENTS"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    # Columns: type|user|database|...; the console's own connection is to "pgbouncer".
    return sum(1 for line in out.splitlines() if line.split("|")[2:3] != ["pgbouncer"])


async def test_three_replicas_through_pgbouncer_share_the_runs_exactly_once(
    pg_setup: RunqSetup, pg_serve_factory: ServeFactory, pgbouncer_url: str
) -> None:
    async with pg_setup.queue() as q:  # migrated directly, before any replica starts
        store = {"url": pgbouncer_url, "pgbouncer": True, "pool_size": 4}
        queue = {"poll_interval": 0.2, "max_concurrency": 8, "lock_grace_seconds": 30}
        routing = {"*": "postgres"}
        replicas = [
            await pg_serve_factory(
                {"store": {**store, "listen_url": PG_URL}, "queue": queue, "routing": routing}
            ),
            await pg_serve_factory(
                {"store": {**store, "listen_url": PG_URL}, "queue": queue, "routing": routing}
            ),
            await pg_serve_factory({"store": store, "queue": queue, "routing": routing}),
        ]
        clients = await anyio.to_thread.run_sync(_bouncer_clients, pgbouncer_url)
        assert clients >= len(replicas), f"replicas bypass PgBouncer: {clients} clients"

        news = [
            NewRun(component_type="task", component_id="record", payload={"i": i})
            for i in range(RUNS - 20)
        ]
        ids = set(await q.store.submit_many(news))
        for i in range(20):
            if api_available():
                body = {"component_type": "task", "component_id": "record", "payload": {"h": i}}
                response = await replicas[i % 3].request("POST", "/runs", json=body)
                assert response.status_code == 202, response.text
                ids.add(str(response.json()["run_id"]))
            else:
                ids.add((await q.defer("task", "record", {"h": i})).run.id)
        await q.store.notifications().send("wake")

        async def all_completed() -> bool:
            return bool((await q.store.stats()).counts.get("completed", 0) == RUNS)

        await wait_for(all_completed, timeout=120, interval=0.25, message="every run completes")

    executions = read_executions(pg_setup.workdir)
    per_run = Counter(run_id for run_id, _, _ in executions)
    assert set(per_run) == ids
    assert max(per_run.values()) == 1, "a run executed twice"
    pids = Counter(pid for _, _, pid in executions)
    assert len(pids) >= 2, f"not shared by the replicas: {pids}"
    assert set(pids) <= {r.pid for r in replicas}
