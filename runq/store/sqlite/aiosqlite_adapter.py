"""The only place runq touches aiosqlite's private attributes.

aiosqlite runs one ``sqlite3.Connection`` on one worker thread and offers a coroutine per
statement. The SQLite store needs three things its public API does not give:

* ``run_on_thread``: run a whole transaction (a plain function over the
  ``sqlite3.Connection``) as ONE job on that thread (``Connection._execute``). One hop
  between the event loop and the thread per transaction instead of one per statement,
  and no other coroutine can slip a statement into the transaction.
* ``raw_connection``: the ``sqlite3.Connection`` itself (``Connection._conn``), which that
  function runs against.
* ``make_daemon`` / ``join_thread``: the worker thread (``Connection._thread``, not a
  daemon by default) is made a daemon so a process that dies without closing the store
  exits instead of hanging, and is joined after a failed open so it never reports to a
  closed event loop.

tests/store/test_aiosqlite_adapter.py checks each of these against the installed
aiosqlite; if an upgrade renames or changes them, that test fails before anything else.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from typing import TypeVar

import aiosqlite

T = TypeVar("T")


async def run_on_thread(conn: aiosqlite.Connection, fn: Callable[[], T]) -> T:
    """Run ``fn`` on the connection's thread, queued behind its other work."""
    result: T = await conn._execute(fn)  # type: ignore[no-untyped-call]
    return result


def raw_connection(conn: aiosqlite.Connection) -> sqlite3.Connection:
    """The ``sqlite3.Connection`` of an opened connection; only use it on its thread."""
    raw: sqlite3.Connection = conn._conn
    return raw


def worker_thread(conn: aiosqlite.Connection) -> threading.Thread:
    thread: threading.Thread = conn._thread
    return thread


def make_daemon(conn: aiosqlite.Connection) -> None:
    """Mark the (not yet started) worker thread a daemon. Exiting mid-transaction is safe:
    SQLite treats it as a crash and the WAL keeps the file consistent."""
    worker_thread(conn).daemon = True


async def join_thread(conn: aiosqlite.Connection, wait_seconds: float) -> None:
    """Wait, without blocking the loop, for the worker thread of a failed open to end."""
    await asyncio.to_thread(worker_thread(conn).join, wait_seconds)
