"""A transaction held open on the database pins PostgreSQL's vacuum horizon: ``runq
status`` warns about it (without failing the check) and the exporter's
``runq_db_oldest_transaction_age_seconds`` shows its age.

Runs in a scratch database of its own: the shared test database has other sessions
whose transactions would be the oldest."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
from conftest import PG_URL
from helpers import wait_for
from prometheus_client.parser import text_string_to_metric_families
from serve_harness import RunqSetup, pg_ready, pg_setup, servers_on

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = ["pg_ready", "pg_setup"]  # fixtures used by name

METRIC = "runq_db_oldest_transaction_age_seconds"


@pytest.fixture
async def scratch_setup(pg_setup: RunqSetup) -> AsyncIterator[RunqSetup]:
    name = f"runq_heldtx_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(PG_URL)
    try:
        await admin.execute(f"CREATE DATABASE {name}")
        pg_setup.store_url = PG_URL.rsplit("/", 1)[0] + f"/{name}"
        yield pg_setup
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()


async def status(setup: RunqSetup, *args: str) -> tuple[int, dict[str, Any]]:
    done = await setup.cli("status", "--json", "--minimum-workers", "0", *args)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


@pytest.fixture
async def holder(scratch_setup: RunqSetup) -> AsyncIterator[asyncpg.Connection]:
    """Another session idle in a transaction that has a transaction id (its snapshot is
    gone between statements under READ COMMITTED: only backend_xid pins the horizon)."""
    assert (await scratch_setup.cli("migrate")).returncode == 0
    code, body = await status(scratch_setup)
    assert code == 0
    assert body["oldest_transaction_age_seconds"] is None
    assert body["warnings"] == []
    con = await asyncpg.connect(scratch_setup.store_url)
    tr = con.transaction()
    await tr.start()
    await con.fetchval("SELECT txid_current()")
    try:
        yield con
    finally:
        await tr.rollback()
        await con.close()


async def test_status_warns_about_a_held_transaction(
    scratch_setup: RunqSetup, holder: asyncpg.Connection
) -> None:
    pid = await holder.fetchval("SELECT pg_backend_pid()")
    seen: dict[str, Any] = {}

    async def warned() -> bool:
        nonlocal seen
        code, seen = await status(scratch_setup, "--max-transaction-age", "1")
        assert code == 0, seen  # a warning, not a failed check
        return bool(seen["warnings"])

    await wait_for(warned, timeout=30, interval=0.3, message="status warns")
    assert seen["healthy"] is True
    assert seen["oldest_transaction_pid"] == pid
    assert seen["oldest_transaction_age_seconds"] > 1
    assert f"pid {pid}" in seen["warnings"][0]
    # Below the threshold (the default is queue.lock_grace_seconds): no warning.
    code, quiet = await status(scratch_setup, "--max-transaction-age", "3600")
    assert (code, quiet["warnings"]) == (0, [])
    assert (await scratch_setup.cli("status", "--max-transaction-age", "-1")).returncode == 2


async def test_the_exporter_shows_the_held_transaction_age(
    scratch_setup: RunqSetup, holder: asyncpg.Connection
) -> None:
    async with servers_on(scratch_setup) as serve:
        server = await serve({})

        async def age() -> float:
            text = (await server.request("GET", "/metrics")).text
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name == METRIC:
                        return float(sample.value)
            raise AssertionError(f"{METRIC} missing")

        async def held() -> bool:
            return await age() > 1

        await wait_for(held, timeout=30, interval=0.5, message="the held transaction's age")
        await holder.execute("COMMIT")
        await holder.execute("BEGIN")  # the fixture's rollback needs a transaction

        async def cleared() -> bool:
            # The server's own statements are transactions too, but of milliseconds.
            return await age() < 1

        await wait_for(cleared, timeout=30, interval=0.5, message="age back to 0")
