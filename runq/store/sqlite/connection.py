"""SQLite connection policy: one writer and one reader connection on one WAL file, every
write one ``BEGIN IMMEDIATE`` transaction run as one job on the writer's thread, and
SQLite failures turned into ``StoreUnavailable`` messages an operator can act on.

* IMMEDIATE takes the file's write lock up front, so two processes never both
  read-then-write and then deadlock on the upgrade; a waiting writer sleeps in SQLite's
  busy handler (``busy_timeout``), never in a retry loop of ours.
* Reads use a second connection (``query_only``): in WAL mode readers never wait for the
  writer, so listings and stats do not queue behind claims.
* Every timestamp is read from the database clock once at the start of the transaction
  and handed to the body as ``now``.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from runq.errors import StoreUnavailable
from runq.store.sqlite import statements as sql
from runq.store.sqlite.aiosqlite_adapter import (
    join_thread,
    make_daemon,
    raw_connection,
    run_on_thread,
)

T = TypeVar("T")
Row = sqlite3.Row
#: A transaction body: runs on the connection thread with the connection and the clock.
Body = Callable[[sqlite3.Connection, float], T]

#: How long a writer waits for another process's write lock before giving up (seconds).
BUSY_TIMEOUT_SECONDS = 10.0


def _clock(conn: sqlite3.Connection, offset: float) -> float:
    value: float = conn.execute(sql.NOW, (offset,)).fetchone()[0]
    return value


def _in_transaction(conn: sqlite3.Connection, body: Body[T], offset: float) -> T:
    """Run ``body`` inside BEGIN IMMEDIATE … COMMIT on the connection thread."""
    conn.execute(sql.BEGIN_IMMEDIATE)
    try:
        result = body(conn, _clock(conn, offset))
        conn.execute(sql.COMMIT)
    except BaseException:
        if conn.in_transaction:
            conn.execute(sql.ROLLBACK)
        raise
    return result


def _in_snapshot(conn: sqlite3.Connection, body: Body[T], offset: float) -> T:
    """Run several reads against one consistent snapshot (a deferred read transaction)."""
    conn.execute(sql.BEGIN)
    try:
        return body(conn, _clock(conn, offset))
    finally:
        if conn.in_transaction:
            conn.execute(sql.COMMIT)


def unavailable(path: Path, error: BaseException) -> StoreUnavailable:
    """A clear, operator-facing message for an SQLite failure."""
    text = str(error)
    low = text.lower()
    if "locked" in low or "busy" in low:
        hint = (
            f"is locked by another process for longer than the busy timeout "
            f"({BUSY_TIMEOUT_SECONDS:g}s)"
        )
    elif "unable to open" in low:
        hint = "cannot be opened (does its directory exist, and may this user write it?)"
    elif "no such table" in low:
        hint = "is not migrated (run `runq migrate`)"
    elif "full" in low:
        hint = "cannot grow: the disk or the file system is full"
    elif "readonly" in low or "read-only" in low:
        hint = "is read-only for this process"
    elif "disk i/o" in low:
        hint = "had a disk I/O error"
    elif "not a database" in low or "malformed" in low:
        hint = "is not a usable SQLite database"
    elif "closed" in low:
        hint = "is closed (the store is not connected)"
    else:
        hint = "refused the operation"
    return StoreUnavailable(f"SQLite database {path} {hint}: {text}")


class Connections:
    """The writer and the reader of one SQLite file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None

    async def call(self, conn: aiosqlite.Connection | None, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the connection's thread; map SQLite failures to StoreUnavailable."""
        if conn is None:
            raise StoreUnavailable(f"SQLite database {self.path}: the store is not connected")
        try:
            return await run_on_thread(conn, fn)
        except (sqlite3.IntegrityError, sqlite3.InterfaceError):
            raise  # a bug in a statement, not an unavailable database
        except sqlite3.ProgrammingError as e:
            if "closed" in str(e).lower():
                raise unavailable(self.path, e) from e
            raise
        except sqlite3.DatabaseError as e:
            raise unavailable(self.path, e) from e
        except ValueError as e:
            if "closed" in str(e).lower() or "no active connection" in str(e).lower():
                raise unavailable(self.path, e) from e
            raise

    async def write(self, body: Body[T], offset: float) -> T:
        """One BEGIN IMMEDIATE transaction on the writer; ``body(conn, now)``."""
        writer = self._writer
        return await self.call(writer, lambda: _in_transaction(_raw(writer), body, offset))

    async def read(self, body: Body[T], offset: float) -> T:
        """A consistent read on the reader connection; ``body(conn, now)``."""
        reader = self._reader
        return await self.call(reader, lambda: _in_snapshot(_raw(reader), body, offset))

    async def read_one(self, statement: str, params: Sequence[Any]) -> Row | None:
        reader = self._reader

        def run() -> Row | None:
            row: Row | None = _raw(reader).execute(statement, params).fetchone()
            return row

        return await self.call(reader, run)

    async def connect(self) -> None:
        if self._writer is not None:
            return
        writer = await self._open(query_only=False)
        try:
            reader = await self._open(query_only=True)
        except BaseException:
            await writer.close()
            raise
        self._writer, self._reader = writer, reader

    async def _open(self, *, query_only: bool) -> aiosqlite.Connection:
        if not query_only:
            create_private(self.path)
        conn = aiosqlite.connect(
            self.path,
            isolation_level=None,  # explicit transactions only: we say BEGIN IMMEDIATE
            timeout=BUSY_TIMEOUT_SECONDS,
            cached_statements=256,
        )
        # aiosqlite's thread is not a daemon: a process that dies without closing the store
        # (a crash, an unhandled error) would hang at exit instead of letting its supervisor
        # restart it.
        make_daemon(conn)
        try:
            await conn
        except sqlite3.Error as e:
            # aiosqlite stops its thread on a failed open without waiting for it; wait here,
            # while the event loop still runs, so the thread never reports to a closed loop.
            await join_thread(conn, BUSY_TIMEOUT_SECONDS)
            raise unavailable(self.path, e) from e
        conn.row_factory = sqlite3.Row
        try:
            pragmas = sql.pragmas(BUSY_TIMEOUT_SECONDS, query_only=query_only)

            def apply() -> None:
                raw = raw_connection(conn)
                for pragma in pragmas:
                    raw.execute(pragma).fetchall()

            await self.call(conn, apply)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def close(self) -> None:
        writer, reader = self._writer, self._reader
        self._writer = self._reader = None
        for conn in (reader, writer):
            if conn is not None:
                # Closing is best effort; the file stays consistent either way (WAL).
                with contextlib.suppress(sqlite3.Error):
                    await conn.close()


def create_private(path: Path) -> None:
    """Create the database file readable by its owner only (it holds user ids and errors in
    clear); SQLite gives its -wal and -shm files the same mode. An existing file is left as
    it is, and so is an in-memory database."""
    if str(path) == ":memory:" or path.exists():
        return
    with contextlib.suppress(FileExistsError, FileNotFoundError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _raw(conn: aiosqlite.Connection | None) -> sqlite3.Connection:
    assert conn is not None
    return raw_connection(conn)
