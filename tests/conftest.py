"""Shared fixtures: real SQLite files and the real PostgreSQL, a fresh schema per test.

PostgreSQL is at RUNQ_TEST_POSTGRES_URL (default postgresql://postgres@127.0.0.1:5432/test).
Where it is unreachable the Postgres tests skip with a reason, except under CI=true,
where they fail.

Tests marked ``exclusive`` (they bound a latency that tests running beside them would
distort) must run alone: ``--exclusive=skip`` leaves them out (the parallel run of
scripts/test, ``-n``), ``--exclusive=only`` runs nothing else (its serial run). An xdist
worker refuses to run one. No test stops the shared PostgreSQL: a test that must stop,
crash or fail over a server takes ``pg_clusters`` (private clusters, tests/pgcluster.py).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from pgcluster import pg_clusters

from runq.seal import KeyRing
from runq.store import make_store
from runq.store.base import Store

PG_URL = os.environ.get("RUNQ_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
ENGINES = ("sqlite", "postgres")
#: One key for the whole session; tests of rotation make their own.
TEST_KEY = bytes(range(32))


EXCLUSIVE_CHOICES = ("include", "skip", "only")
#: Fixtures every test may ask for by name: private PostgreSQL clusters (tests/pgcluster.py).
__all__ = ["pg_clusters"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--exclusive",
        choices=EXCLUSIVE_CHOICES,
        default="include",
        help="tests marked exclusive (they bound a latency): include (default), skip, only",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mode = config.getoption("exclusive")
    if mode == "include":
        return
    keep = [i for i in items if _is_exclusive(i) == (mode == "only")]
    dropped = [i for i in items if _is_exclusive(i) != (mode == "only")]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def _is_exclusive(item: pytest.Item) -> bool:
    return item.get_closest_marker("exclusive") is not None


@pytest.hookimpl(tryfirst=True)  # before any fixture of the test is set up
def pytest_runtest_setup(item: pytest.Item) -> None:
    # On an xdist worker other tests run at the same time and would distort the latency
    # this test bounds. It fails instead, before it touches anything.
    if _is_exclusive(item) and hasattr(item.config, "workerinput"):
        pytest.fail(
            "marked exclusive: cannot run under xdist (-n); run it alone with "
            "--exclusive=only and the rest with --exclusive=skip (scripts/test does both)",
            pytrace=False,
        )


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Facts a passing test measured (``record_property("measured", text)``), shown at the
    end of every run, also from xdist workers and under ``-q``: e.g. the image size."""
    lines = [
        str(value)
        for report in terminalreporter.stats.get("passed", [])
        for name, value in getattr(report, "user_properties", [])
        if name == "measured"
    ]
    if lines:
        terminalreporter.write_sep("-", "measured")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


_pg_state: dict[str, str | None] = {}


def _check_postgres() -> str | None:
    """None when PostgreSQL answers, else the reason it does not. The probe runs its own
    event loop in a thread, so it works from sync and async fixtures alike."""
    if "reason" not in _pg_state:
        import asyncio
        import threading

        async def probe() -> None:
            conn = await asyncpg.connect(PG_URL, timeout=5)
            await conn.close()

        def run() -> None:
            try:
                asyncio.run(probe())
                _pg_state["reason"] = None
            except (OSError, asyncpg.PostgresError, TimeoutError) as e:
                _pg_state["reason"] = f"PostgreSQL at {PG_URL} unreachable: {e}"

        thread = threading.Thread(target=run, name="pg-probe", daemon=True)
        thread.start()
        thread.join(timeout=15)
        _pg_state.setdefault("reason", f"PostgreSQL at {PG_URL} did not answer within 15 s")
    return _pg_state["reason"]


def require_postgres() -> None:
    reason = _check_postgres()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"{reason} (CI=true: Postgres tests must run)")
        pytest.skip(reason)


@pytest.fixture
def pg_url() -> str:
    require_postgres()
    return PG_URL


def new_schema_name() -> str:
    return f"runq_t_{secrets.token_hex(5)}"


async def drop_schema(schema: str) -> None:
    conn = await asyncpg.connect(PG_URL)
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    finally:
        await conn.close()


@pytest.fixture
async def pg_schema() -> AsyncIterator[str]:
    """A fresh, empty Postgres schema name, dropped after the test."""
    require_postgres()
    schema = new_schema_name()
    yield schema
    await drop_schema(schema)


@pytest.fixture
def key_ring() -> KeyRing:
    return KeyRing([TEST_KEY])


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'runq.db'}"


async def open_test_store(engine: str, tmp_path: Path, key_ring: KeyRing) -> tuple[Store, str, str]:
    """A connected, migrated store: (store, url, schema)."""
    if engine == "postgres":
        require_postgres()
        url, schema = PG_URL, new_schema_name()
    else:
        url, schema = f"sqlite:///{tmp_path / 'runq.db'}", "runq"
    store = make_store(url, schema=schema, sealer=key_ring)
    await store.connect()
    await store.migrate()
    return store, url, schema


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def store(engine: str, tmp_path: Path, key_ring: KeyRing) -> AsyncIterator[Store]:
    """The same test once per engine, each on a fresh database/schema."""
    s, _url, schema = await open_test_store(engine, tmp_path, key_ring)
    try:
        yield s
    finally:
        await s.close()
        if engine == "postgres":
            await drop_schema(schema)


@pytest.fixture
def in_ci() -> bool:
    return IN_CI
