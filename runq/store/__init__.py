"""Storage engines behind one protocol. ``open_store`` picks the engine from the URL."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from runq.config import Config, StoreConfig, store_engine
from runq.errors import ConfigError, SealError
from runq.limits import LimitRules
from runq.seal import KeyRing, Sealer, ensure_key_file, key_file_for, load_key_ring
from runq.store.base import Store

__all__ = ["Store", "make_store", "open_store", "sealer_for", "sqlite_path"]


def sqlite_path(url: str) -> Path:
    """``sqlite:///runq.db`` → ``runq.db``; ``sqlite:////var/lib/runq/runq.db`` → absolute."""
    return Path(url.removeprefix("sqlite:///"))


def sealer_for(config: Config) -> KeyRing:
    """The configured key ring; on SQLite with no keys, the key file beside the database."""
    if config.seal.keys:
        return load_key_ring(config.seal.keys)
    if store_engine(config.store.url) == "sqlite":
        return ensure_key_file(key_file_for(sqlite_path(config.store.url)))
    raise ConfigError(
        "seal.keys",
        "PostgreSQL needs at least one seal key shared by the fleet, e.g. "
        'keys = ["env:RUNQ_SEAL_KEY"] (make one with `runq keys generate`)',
    )


class _NoKeys:
    """A sealer for a connection that only checks the database is there."""

    @property
    def sealing_key_id(self) -> bytes:
        raise SealError("no seal key is configured")

    def seal(self, column: str, run_id: str, plaintext: bytes) -> bytes:
        raise SealError("no seal key is configured")

    def seal_many(
        self, column: str, run_ids: Sequence[str], plaintexts: Sequence[bytes]
    ) -> list[bytes]:
        raise SealError("no seal key is configured")

    def open(self, column: str, run_id: str, sealed: bytes) -> bytes:
        raise SealError("no seal key is configured")

    def has_key(self, key_id: bytes) -> bool:
        return False


async def _check_reachable(config: Config) -> None:
    """Connect and ping once; raises ``StoreUnavailable`` when the database is away."""
    store = make_store(config.store.url, schema=config.store.schema, sealer=_NoKeys())
    try:
        await store.connect()
        await store.ping()
    finally:
        with anyio.CancelScope(shield=True):
            await store.close()


def make_store(
    url: str, *, schema: str, sealer: Sealer, settings: StoreConfig | None = None
) -> Store:
    """An unconnected store for ``url``; call ``await store.connect()``. ``settings``: the
    rest of ``[store]`` (pool size, PgBouncer, LISTEN URL)."""
    engine = store_engine(url)
    if engine == "sqlite":
        from runq.store.sqlite import SqliteStore

        return SqliteStore(sqlite_path(url), schema=schema, sealer=sealer)
    from runq.store.postgres import PostgresStore

    if settings is None:
        return PostgresStore(url, schema=schema, sealer=sealer)
    return PostgresStore(
        url,
        schema=schema,
        sealer=sealer,
        max_size=settings.pool_size,
        pgbouncer=settings.pgbouncer,
        listen_url=settings.listen_url,
    )


@asynccontextmanager
async def open_store(config: Config) -> AsyncIterator[Store]:
    """The connected store of ``config`` (``[store]``, sealed with ``[seal] keys``); closed
    when the block ends, even when it is cancelled."""
    try:
        sealer = sealer_for(config)
    except ConfigError:
        # A database that cannot be reached is the first thing to fix (exit 1), and the
        # error a newcomer should see first; the missing key comes next. (SQLite is not
        # probed: opening it would create the file.)
        if store_engine(config.store.url) == "postgres":
            await _check_reachable(config)
        raise
    store = make_store(
        config.store.url, schema=config.store.schema, sealer=sealer, settings=config.store
    )
    store.limits = LimitRules.from_config(config)
    await store.connect()
    try:
        yield store
    finally:
        with anyio.CancelScope(shield=True):
            await store.close()
