"""The SQLite engine: ``statements`` holds every SQL text, ``connection`` the connections
and their transaction and error policy (``aiosqlite_adapter`` the one reach into aiosqlite
internals), ``store`` the verbs and their row mapping."""

from runq.store.sqlite.store import SqliteStore

__all__ = ["SqliteStore"]
