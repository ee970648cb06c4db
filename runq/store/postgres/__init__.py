"""The PostgreSQL engine: ``statements`` holds every SQL text, ``connection`` the pool and
its error policy, ``store`` the verbs and their row mapping."""

from runq.store.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
