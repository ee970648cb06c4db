"""A failover behind one DNS name (the cloud style): ``[store] url`` names a host whose
address moves from the dead primary to the promoted standby, and ``runq serve`` follows it
without a restart: writes, claims and ``LISTEN`` all end on the new primary.

The name is private to the server process: it runs in a mount namespace of its own
(``unshare -m``) where a hosts file of the test's is bind-mounted over ``/etc/hosts``, so
rewriting that file moves the name for the server alone (the resolver reads the file at
every lookup). The two servers listen on the same port at two loopback addresses.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
from helpers import wait_for
from pgcluster import PgClusterFactory
from serve_harness import RunqServer, database_for, free_port, servers_on

from runq.model import Status

pytestmark = [pytest.mark.anyio, pytest.mark.postgres, pytest.mark.daemon]

NAME = "pg-primary.runq.test"
FIRST, SECOND = "127.0.0.2", "127.0.0.3"
POLL = 30.0
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
#: Runs the server with the hosts file (its first argument) over /etc/hosts.
NAMESPACE = 'mount --bind "$0" /etc/hosts && exec "$@"'


def private_names_or_skip() -> None:
    ok = shutil.which("unshare") is not None and (
        subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False).returncode == 0
    )
    if not ok:
        reason = "no mount namespaces here (unshare -m): cannot give a process its own names"
        if IN_CI:
            pytest.fail(f"{reason} (CI=true)")
        pytest.skip(reason)


def port_free_on_both() -> int:
    for _ in range(50):
        port = free_port()
        try:
            for host in (FIRST, SECOND):
                with socket.socket() as s:
                    s.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no port free on both loopback addresses")


async def submit(server: RunqServer, i: int) -> str:
    body = {"component_type": "task", "component_id": "ledger", "payload": {"i": i}}

    async def acknowledged() -> str | None:
        try:
            response = await server.request("POST", "/runs", json=body)
        except Exception:
            return None
        return response.json()["run_id"] if response.status_code == 202 else None

    run_id: str = await wait_for(acknowledged, timeout=30, message="a 202")
    return run_id


async def completed(server: RunqServer, run_id: str) -> bool:
    response = await server.request("GET", f"/runs/{run_id}")
    return response.status_code == 200 and response.json()["status"] == Status.COMPLETED.value


async def test_the_daemon_follows_a_dns_name_to_the_promoted_standby(
    pg_clusters: PgClusterFactory, tmp_path: Path
) -> None:
    private_names_or_skip()
    port = port_free_on_both()
    primary = await pg_clusters.start("pg_a", host=FIRST, port=port)
    standby = await primary.add_standby("pg_b", host=SECOND, port=port)
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{FIRST} {NAME}\n", encoding="utf-8")
    url = f"postgresql://postgres@{NAME}:{port}/postgres"
    config = {"queue": {"poll_interval": POLL, "lock_grace_seconds": 10}}
    config["routing"] = {"*": "postgres"}  # type: ignore[assignment]
    async with (
        database_for("postgres", tmp_path, store_url=url) as setup,
        servers_on(setup) as start,
    ):
        server = await start(config, prefix=["unshare", "-m", "sh", "-c", NAMESPACE, str(hosts)])
        first = await submit(server, 1)
        await wait_for(lambda: completed(server, first), timeout=10, message="a run before")
        assert (await server.request("GET", "/readyz")).json()["database"] == primary.address

        await primary.kill()
        await standby.promote()
        # The cloud moves the name (in place: the bind mount holds the file, not the name).
        hosts.write_text(f"127.0.0.1 localhost\n{SECOND} {NAME}\n", encoding="utf-8")

        after = await submit(server, 2)
        await wait_for(lambda: completed(server, after), timeout=30, message="a run after")
        ready = (await server.request("GET", "/readyz")).json()
        assert ready["database"] == standby.address
        metrics = (await server.request("GET", "/metrics")).text
        assert "runq_store_failovers_total 1.0" in metrics
        assert f'runq_store_primary_info{{server="{standby.address}"}} 1.0' in metrics
        assert '"store.primary_changed"' in server.logs()
        overview = (await server.request("GET", "/ui", follow_redirects=True)).text
        assert "Database primary" in overview
        assert standby.address in overview

        # LISTEN moved too: a run submitted on the new primary from elsewhere is claimed
        # at once, although the daemon polls only every 30 s.
        await wait_for(
            lambda: server.logs().count('"listener.reconnected"') >= 1,
            timeout=30,
            message="the listener reconnected",
        )
        async with setup.queue({"store": {"url": standby.url}, **config}) as q:
            sent = time.monotonic()
            probe = (await q.defer("task", "ledger", {"probe": True})).run
            await wait_for(lambda: completed(server, probe.id), timeout=POLL / 2, message="woken")
            assert time.monotonic() - sent < 5, "found by the poll, not woken by NOTIFY"
