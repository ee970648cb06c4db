"""Connections a replica can count: the claim path's own pool, the LISTEN URL, the bounds."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from conftest import PG_URL, drop_schema, new_schema_name, require_postgres

from runq.config import load_config
from runq.errors import ConfigError
from runq.model import NewRun
from runq.seal import KeyRing
from runq.store.postgres import PostgresStore

pytestmark = pytest.mark.anyio


def _store(schema: str, **options: Any) -> PostgresStore:
    return PostgresStore(PG_URL, schema=schema, sealer=KeyRing([os.urandom(32)]), **options)


def test_listen_url_is_direct_or_none_behind_pgbouncer() -> None:
    assert _store("runq").listen_url == PG_URL
    assert _store("runq", pgbouncer=True).listen_url is None  # poll only
    direct = "postgresql://postgres@db.internal:5432/test"
    assert _store("runq", pgbouncer=True, listen_url=direct).listen_url == direct


@pytest.mark.parametrize("size", [0, -1, 1001])
def test_pool_size_is_bounded(tmp_path: Path, size: int) -> None:
    path = tmp_path / "runq.toml"
    path.write_text(f'[store]\nurl = "{PG_URL}"\npool_size = {size}\n', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"store\.pool_size"):
        load_config(path, environ={})


@pytest.mark.postgres
async def test_claims_run_on_their_own_connection_opened_on_first_claim() -> None:
    require_postgres()
    schema = new_schema_name()
    store = _store(schema, application_name=f"t-{schema}")
    await store.connect()
    try:
        await store.migrate()
        await store.submit_many(
            [NewRun(component_type="task", component_id="x", payload={}) for _ in range(3)]
        )

        async def names() -> list[str]:
            con = await asyncpg.connect(PG_URL)
            try:
                rows = await con.fetch(
                    "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE $1",
                    f"t-{schema}%",
                )
            finally:
                await con.close()
            return sorted(r["application_name"] for r in rows)

        assert f"t-{schema} claims" not in await names()  # not before the first claim
        claimed = await store.claim("w-test", 3, deployment_id=None)
        assert len(claimed) == 3
        assert f"t-{schema} claims" in await names()
        # Claims commit without waiting for the WAL flush; everything else waits.
        show = "SHOW synchronous_commit"
        assert await store._claims.fetchval(show) == "off"  # type: ignore[attr-defined]
        assert await store._db.fetchval(show) == "on"  # type: ignore[attr-defined]
    finally:
        await store.close()
        await drop_schema(schema)
