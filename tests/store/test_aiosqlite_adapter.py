"""The SQLite engine's one reach into aiosqlite internals, checked against the installed
aiosqlite: if an upgrade renames or changes ``_execute``, ``_conn`` or ``_thread``, these
tests fail here, by name, instead of the store failing somewhere deep."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import aiosqlite
import pytest

from runq.store.sqlite.aiosqlite_adapter import (
    join_thread,
    make_daemon,
    raw_connection,
    run_on_thread,
    worker_thread,
)


async def test_the_private_attributes_exist(tmp_path: Path) -> None:
    conn = aiosqlite.connect(tmp_path / "a.db")
    assert callable(getattr(conn, "_execute", None)), "aiosqlite.Connection._execute is gone"
    assert isinstance(getattr(conn, "_thread", None), threading.Thread), "_thread is gone"
    make_daemon(conn)
    assert worker_thread(conn).daemon
    await conn
    try:
        assert isinstance(raw_connection(conn), sqlite3.Connection), "_conn is gone"
    finally:
        await conn.close()


async def test_a_function_runs_on_the_connection_thread_with_the_raw_connection(
    tmp_path: Path,
) -> None:
    conn = aiosqlite.connect(tmp_path / "a.db", isolation_level=None)
    make_daemon(conn)
    await conn
    try:

        def transaction() -> tuple[int, int]:
            raw = raw_connection(conn)
            raw.execute("BEGIN IMMEDIATE")
            raw.execute("CREATE TABLE t (x INTEGER)")
            raw.executemany("INSERT INTO t VALUES (?)", [(1,), (2,)])
            total = raw.execute("SELECT sum(x) FROM t").fetchone()[0]
            raw.execute("COMMIT")
            return threading.get_ident(), total

        ident, total = await run_on_thread(conn, transaction)
        assert total == 3
        assert ident == worker_thread(conn).ident
        assert ident != threading.get_ident()
        with pytest.raises(ZeroDivisionError):
            await run_on_thread(conn, lambda: 1 // 0)  # errors come back to the caller
    finally:
        await conn.close()


async def test_a_failed_open_leaves_a_thread_that_can_be_joined(tmp_path: Path) -> None:
    conn = aiosqlite.connect(tmp_path / "missing" / "a.db")
    make_daemon(conn)
    with pytest.raises(sqlite3.Error):
        await conn
    await join_thread(conn, 5.0)
    assert not worker_thread(conn).is_alive()
