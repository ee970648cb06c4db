"""``[store]``: where the runs live, and the helpers that read its URL."""

from __future__ import annotations

import re

import msgspec

from runq.config.checks import require
from runq.errors import ConfigError

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class StoreConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    url: str = "sqlite:///runq.db"
    schema: str = "runq"
    #: PostgreSQL: connections of the shared pool (API, completions, heartbeats, maintenance).
    #: A replica opens at most this many, plus one for claims and one for LISTEN.
    pool_size: int = 10
    #: PostgreSQL behind PgBouncer in transaction mode: no server-side prepared statements,
    #: and LISTEN only on ``listen_url`` (poll-only without one).
    pgbouncer: bool = False
    #: PostgreSQL: a direct URL (not through a pooler) for LISTEN wake-ups; empty: ``url``,
    #: or no LISTEN at all when ``pgbouncer`` is on.
    listen_url: str = ""


def store_engine(url: str) -> str:
    if url.startswith("sqlite:///") or url == "sqlite://:memory:":
        return "sqlite"
    if url.startswith(("postgresql://", "postgres://")):
        return "postgres"
    raise ConfigError(
        "store.url",
        f"{redact_url(url)!r} is neither 'sqlite:///path.db' nor 'postgresql://user@host:port/db'",
    )


def redact_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)


def validate_store(s: StoreConfig) -> None:
    store_engine(s.url)
    require(
        bool(_SCHEMA_RE.match(s.schema)),
        "store.schema",
        f"{s.schema!r} must be a lower-case SQL identifier ([a-z_][a-z0-9_]*)",
    )
    require(1 <= s.pool_size <= 1000, "store.pool_size", f"{s.pool_size} must be 1 to 1000")
    if s.listen_url:
        require(
            store_engine(s.listen_url) == "postgres", "store.listen_url", "must be postgresql://"
        )
