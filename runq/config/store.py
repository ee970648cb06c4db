"""``[store]``: where the runs live, and the helpers that read its URL."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

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
    #: PostgreSQL: refuse to start unless the database replicates synchronously (an
    #: acknowledged run then survives a failover to the synchronous standby).
    require_synchronous_replication: bool = False


#: ``target_session_attrs`` that keep every connection on the writable primary (runq
#: writes on every connection); absent means ``read-write``.
WRITABLE_TARGETS = ("read-write", "primary")


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
    for key, url in (("store.url", s.url), ("store.listen_url", s.listen_url)):
        _check_target(key, url)
    require(
        not s.require_synchronous_replication or store_engine(s.url) == "postgres",
        "store.require_synchronous_replication",
        "only PostgreSQL replicates: set it false on SQLite",
    )


def target_session_attrs(url: str) -> str | None:
    """The ``target_session_attrs`` a PostgreSQL URL asks for (the last one given), or None."""
    values = parse_qs(urlsplit(url).query).get("target_session_attrs")
    return values[-1] if values else None


def _check_target(key: str, url: str) -> None:
    """A URL may name several hosts; whichever it asks for, runq needs the writable one."""
    if not url.startswith(("postgresql://", "postgres://")):
        return
    targets = parse_qs(urlsplit(url).query).get("target_session_attrs", [])
    for target in targets:
        require(
            target in WRITABLE_TARGETS,
            key,
            f"target_session_attrs={target!r}: runq writes on every connection, so it must "
            f"be one of {', '.join(WRITABLE_TARGETS)} (or absent: read-write)",
        )
