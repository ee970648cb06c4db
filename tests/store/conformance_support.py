"""What the store conformance suite's modules share (``tests/store/test_*.py`` of the
store's concerns): the ``store`` fixture built through ``handle`` (so a test can also see
raw rows), and small helpers.

Each conformance module runs once per engine (the ``store`` fixture is parametrised over
SQLite and PostgreSQL); an engine is done when every one of them passes on it. Times come
from the database clock, moved with ``store.clock_offset_seconds`` instead of sleeping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import PG_URL, new_schema_name, require_postgres
from factories import StoreHandle

import runq.store
from runq.model import Run
from runq.store.base import Store

GRACE = 60.0
DAY = 86400.0
#: Slack for comparing database timestamps taken a few statements apart.
CLOCK_SLACK = 2.0


@pytest.fixture
def store(handle: StoreHandle) -> Store:
    """The conftest ``store``, but built through ``handle`` so tests can also see raw rows."""
    return handle.store


async def claim(
    store: Store,
    worker: str = "w1",
    slots: int = 10,
    *,
    deployment_id: str | None = None,
    **kw: Any,
) -> list[Run]:
    return await store.claim(worker, slots, deployment_id=deployment_id, **kw)


def ids(runs: list[Run]) -> set[str]:
    return {r.id for r in runs}


async def get(store: Store, run_id: str) -> Run:
    run = await store.get(run_id)
    assert run is not None, f"run {run_id} is missing"
    return run


def fresh_location(engine: str, tmp_path: Path, filename: str) -> tuple[str, str]:
    """(url, schema) of an empty, unmigrated database for ``engine``."""
    if engine == "postgres":
        require_postgres()
        return PG_URL, new_schema_name()
    return f"sqlite:///{tmp_path / filename}", "runq"


def migration_count(engine: str) -> int:
    folder = Path(runq.store.__file__).parent / "migrations" / engine
    return len(list(folder.glob("[0-9][0-9][0-9][0-9]_*.sql")))
