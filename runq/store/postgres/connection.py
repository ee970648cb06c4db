"""PostgreSQL connection policy: the asyncpg pool, which errors mean "unavailable", when a
statement may be tried again on a fresh connection, and when the database's own abort (a
deadlock, a serialization failure) is tried again at once. Every connection goes to the
writable primary of the URL's servers (``cluster.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import asyncpg
import asyncpg.exceptions as pgerr

from runq.config import redact_url
from runq.errors import StoreContention, StoreUnavailable
from runq.log import get_logger
from runq.loops import CONTENTION_BACKOFF
from runq.metrics import STORE_RETRIES
from runq.store.postgres.cluster import (
    NOT_PRIMARY,
    PrimaryTracker,
    connect_options,
    outage_detail,
)

T = TypeVar("T")

log = get_logger(__name__)

#: Errors that mean "the database is not reachable right now", never "your request is wrong".
#: OperatorIntervention covers admin shutdown, crash recovery and "cannot connect now";
#: InsufficientResources covers too many connections, out of memory and a full disk.
#: The statement may or may not have reached the server.
MAYBE_SENT: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    pgerr.PostgresConnectionError,
    pgerr.OperatorInterventionError,
    pgerr.InsufficientResourcesError,
    pgerr.ReadOnlySQLTransactionError,  # a failed-over primary that is now a standby
)
#: The client refused to start the operation on a broken or closed connection, so nothing
#: was sent. A pooled connection whose backend died while idle ends up here on its next
#: use ("cannot switch to state ...; another operation is in progress").
NOT_SENT: tuple[type[BaseException], ...] = (asyncpg.InterfaceError, pgerr.InternalClientError)
#: ...except these subclasses, which are mistakes in the request, not an outage.
NOT_AN_OUTAGE: tuple[type[BaseException], ...] = (
    pgerr.DataError,
    pgerr.ClientConfigurationError,
    pgerr.UnsupportedClientFeatureError,
    pgerr.UnsupportedServerFeatureError,
    pgerr.OutdatedSchemaCacheError,
)
UNAVAILABLE: tuple[type[BaseException], ...] = (*MAYBE_SENT, *NOT_SENT)
#: Errors of connect(): the above plus a refused login or an unknown database.
CONNECT_ERRORS: tuple[type[BaseException], ...] = (*UNAVAILABLE, asyncpg.PostgresError)


#: What a schema that was never migrated answers: no runq tables (or no schema) yet.
NOT_MIGRATED: tuple[type[BaseException], ...] = (
    pgerr.UndefinedTableError,
    pgerr.InvalidSchemaNameError,
)


#: What PostgreSQL answers when it aborted a transaction to break a lock cycle (40P01) or
#: a serialization conflict (40001, under REPEATABLE READ or SERIALIZABLE, which a server or
#: role default may impose), or when a lock wait ran out (55P03: runq sets no
#: ``lock_timeout``, but a server or role may). The whole transaction was rolled back:
#: nothing of it was written, so running it again cannot apply anything twice. Each is a
#: label of ``runq_store_retries_total``.
CONTENTION: dict[type[BaseException], str] = {
    pgerr.DeadlockDetectedError: "deadlock",
    pgerr.SerializationError: "serialization",
    pgerr.LockNotAvailableError: "lock_timeout",
}
CONTENTION_ERRORS: tuple[type[BaseException], ...] = tuple(CONTENTION)
#: Tries of a statement (or transaction) the database keeps aborting for contention before
#: ``StoreContention`` goes to the caller, whose own loop tries again later.
CONTENTION_ATTEMPTS = 5


def contention_reason(error: BaseException) -> str:
    return next(reason for kind, reason in CONTENTION.items() if isinstance(error, kind))


def is_outage(error: BaseException) -> bool:
    return isinstance(error, UNAVAILABLE) and not isinstance(error, NOT_AN_OUTAGE)


def not_applied(error: BaseException) -> bool:
    """True when the statement certainly changed nothing: never sent, or refused by a
    server that takes no writes (a standby after a failover), so trying it again on a
    fresh connection, which goes to the new primary, cannot run a write twice."""
    return isinstance(error, (*NOT_SENT, *NOT_PRIMARY))


class PoolFloorFilter(logging.Filter):
    """asyncpg's pool logs a WARNING with a full traceback each time it fails to reopen
    its minimum of connections ("Failed to restore the pool connection floor"): about once
    a second per pool while the database is away, the same outage runq already reports
    once (``store.unreachable``). Each becomes one debug line of runq's, without the
    traceback; other records of the ``asyncpg.pool`` logger pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        if "connection floor" not in record.getMessage():
            return True
        error = record.exc_info[1] if record.exc_info else None
        log.debug(
            "store.pool_reconnect_failed",
            error=(str(error) or type(error).__name__) if error else record.getMessage(),
        )
        return False


_POOL_FLOOR_FILTER = PoolFloorFilter()


def quiet_pool_floor_warnings() -> None:
    """Install ``PoolFloorFilter`` on asyncpg's pool logger (once per process)."""
    logging.getLogger("asyncpg.pool").addFilter(_POOL_FLOOR_FILTER)


async def _reset_connection(con: asyncpg.Connection) -> None:
    """Pool release hook: nothing to do.

    asyncpg's default reset sends ``RESET ALL; UNLISTEN *; ...`` on every release: a
    second round trip per verb. This pool never changes session state (no LISTEN, no
    session advisory locks, no SET), and the pool itself rolls back an open transaction
    before calling this hook, so skipping the reset is safe and halves the latency of
    every single-statement verb.
    """


def session_settings(
    application_name: str, *, pooled: bool = False, synchronous_commit: bool = True
) -> dict[str, str]:
    """The settings every runq connection starts its session with (``Pool``): behind
    PgBouncer (``pooled``) only its name, which is all PgBouncer passes on."""
    if pooled:
        return {"application_name": application_name}
    return {
        "application_name": application_name,
        # Queue statements are short OLTP; JIT compilation only adds latency.
        "jit": "off",
        # Plan each prepared statement once. Custom plans re-plan the claim on every call
        # (about a third of its cost), and only because a generic plan cannot see LIMIT $n
        # and over-estimates it; every statement here is written to get the same index
        # paths in its generic plan (primary key probes via = ANY, literal LIMITs where
        # they steer the plan; see bench/CLAIM_EXPLAIN.md).
        "plan_cache_mode": "force_generic_plan",
        # ...and that plan must stay right as the table grows. It is made at a
        # statement's first execution on this connection and kept; on an empty table (or
        # one analyzed while empty) every scan costs nothing, so the planner picked
        # sequential scans that then read the whole table on every call for the
        # connection's life. Every statement of runq has an index path and is written for
        # it (docs/INTERNALS.md, "Plans"); this only adds a large cost to sequential scans
        # (one is still made where nothing else can answer), so the choice is among index
        # paths at any size. Custom plans would follow the table too, at about twice the
        # database CPU of a heartbeat or a completion (tests/store/test_pg_plans.py).
        "enable_seqscan": "off",
        "synchronous_commit": "on" if synchronous_commit else "off",
    }


class Pool:
    """An asyncpg pool with runq's error policy: connection failures become
    ``StoreUnavailable`` naming the URL without its password, and a statement is tried once
    more on a fresh connection only when that cannot run a write twice."""

    def __init__(
        self,
        url: str,
        *,
        min_size: int,
        max_size: int,
        command_timeout: float,
        connect_timeout: float,
        application_name: str,
        pooled: bool = False,
        synchronous_commit: bool = True,
        tracker: PrimaryTracker | None = None,
        name_of: Callable[[str], str] = lambda _sql: "other",
    ) -> None:
        """``pooled``: behind PgBouncer in transaction mode, where a server-side prepared
        statement may be gone (or belong to another client) by the next transaction, and
        startup settings other than ``application_name`` are not passed on.
        ``synchronous_commit=False``: a commit does not wait for its WAL flush (the claim
        pool; see ``PostgresBase``). ``tracker``: identifies each new connection's server
        and follows the primary (shared by the store's pools and its listener). ``name_of``:
        a statement text's name, the ``verb`` label of a contention retry."""
        self.url = url
        self._name_of = name_of
        self._tracker = tracker or PrimaryTracker(url)
        self._pooled = pooled
        self._synchronous_commit = synchronous_commit
        self._min_size = min_size
        self._max_size = max_size
        self._command_timeout = command_timeout
        self._connect_timeout = connect_timeout
        self._application_name = application_name
        self._pool: asyncpg.Pool | None = None

    @property
    def connected(self) -> bool:
        return self._pool is not None

    def unavailable(self, error: BaseException) -> StoreUnavailable:
        # A failure inside a transaction surfaces as "cannot call Transaction.__aexit__()";
        # the first outage in the chain says what actually happened.
        while isinstance(error.__context__, UNAVAILABLE):
            error = error.__context__
        detail = outage_detail(error)
        return StoreUnavailable(f"PostgreSQL at {redact_url(self.url)} is unavailable: {detail}")

    def not_migrated(self, error: BaseException) -> StoreUnavailable:
        return StoreUnavailable(
            f"PostgreSQL at {redact_url(self.url)}: the schema is not migrated: "
            f"run `runq migrate` ({error})"
        )

    @property
    def _live(self) -> asyncpg.Pool:
        if self._pool is None:
            raise StoreUnavailable(f"PostgreSQL store {redact_url(self.url)} is not connected")
        return self._pool

    async def connect(self) -> None:
        if self._pool is not None:
            return
        quiet_pool_floor_warnings()
        try:
            self._pool = await asyncpg.create_pool(
                self.url,
                min_size=self._min_size,
                max_size=self._max_size,
                command_timeout=self._command_timeout,
                timeout=self._connect_timeout,
                reset=_reset_connection,
                init=self._tracker.check,
                statement_cache_size=0 if self._pooled else 100,
                server_settings=self._server_settings(),
                **connect_options(self.url),
            )
        except CONNECT_ERRORS as e:
            raise self.unavailable(e) from e

    def _server_settings(self) -> dict[str, str]:
        return session_settings(
            self._application_name,
            pooled=self._pooled,
            synchronous_commit=self._synchronous_commit,
        )

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        try:
            await asyncio.wait_for(pool.close(), timeout=10)
        except UNAVAILABLE:  # includes TimeoutError: connections that will not close
            pool.terminate()

    async def call(
        self, op: Callable[[asyncpg.Pool], Awaitable[T]], *, retry: bool = False, verb: str
    ) -> T:
        """Run ``op`` on the pool; map connection failures, and a schema that was never
        migrated, to ``StoreUnavailable``; run it again when the database aborted it for
        contention (``contended``)."""
        try:
            return await self.contended(lambda: self._call(op, retry=retry), verb=verb)
        except NOT_MIGRATED as e:
            raise self.not_migrated(e) from e

    async def contended(self, attempt: Callable[[], Awaitable[T]], *, verb: str) -> T:
        """``attempt()``, tried again with a short backoff while the database aborts it for
        contention (``CONTENTION``): each abort is counted in ``runq_store_retries_total``
        under ``verb`` and its reason; after ``CONTENTION_ATTEMPTS`` tries the caller gets
        ``StoreContention``, which every loop of runq retries as it retries an outage. A
        deadlock is never the database's decision on a run: it is never a failed run nor a
        dropped completion."""
        tries = 0
        while True:
            try:
                return await attempt()
            except CONTENTION_ERRORS as e:
                tries += 1
                reason = contention_reason(e)
                STORE_RETRIES.labels(verb=verb, reason=reason).inc()
                if tries >= CONTENTION_ATTEMPTS:
                    raise StoreContention(
                        f"PostgreSQL aborted {verb} {tries} times ({reason}): {e}"
                    ) from e
                await anyio.sleep(CONTENTION_BACKOFF.delay(tries))

    async def _call(self, op: Callable[[asyncpg.Pool], Awaitable[T]], *, retry: bool) -> T:
        """Run ``op`` on the pool; map connection failures to ``StoreUnavailable``.

        After a failure every pooled connection is expired, so the next call reconnects
        (to the new primary, after a failover) instead of tripping over the next dead
        connection of a restarted server. The call is tried once more on a fresh
        connection when that is safe: always for reads (``retry``), and for writes only
        when the statement certainly changed nothing (``not_applied``). A write that may
        have reached the server is never repeated: it may have committed.
        """
        pool = self._live
        try:
            return await op(pool)
        except UNAVAILABLE as e:
            if not is_outage(e):
                raise
            await self._expire(pool, e)
            if not (retry or not_applied(e)):
                raise self.unavailable(e) from e
        try:
            return await op(pool)
        except UNAVAILABLE as e:
            if not is_outage(e):
                raise
            await self._expire(pool, e)
            raise self.unavailable(e) from e

    async def _expire(self, pool: asyncpg.Pool, error: BaseException) -> None:
        self._tracker.noticed(error)
        # Best effort: the pool replaces a broken connection on its own anyway.
        with contextlib.suppress(Exception):
            await pool.expire_connections()

    async def fetch(self, sql: str, *args: Any, retry: bool = False) -> list[asyncpg.Record]:
        return await self.call(lambda p: p.fetch(sql, *args), retry=retry, verb=self._name_of(sql))

    async def fetchrow(self, sql: str, *args: Any, retry: bool = False) -> asyncpg.Record | None:
        return await self.call(
            lambda p: p.fetchrow(sql, *args), retry=retry, verb=self._name_of(sql)
        )

    async def fetchone(self, sql: str, *args: Any, retry: bool = False) -> asyncpg.Record:
        """The row of a statement that always returns exactly one (an aggregate, an
        upsert with RETURNING)."""
        row = await self.fetchrow(sql, *args, retry=retry)
        if row is None:
            raise AssertionError("a one-row statement returned no row")
        return row

    async def fetchval(self, sql: str, *args: Any, retry: bool = False) -> Any:
        return await self.call(
            lambda p: p.fetchval(sql, *args), retry=retry, verb=self._name_of(sql)
        )

    async def in_transaction(
        self, body: Callable[[asyncpg.Connection], Awaitable[T]], *, verb: str
    ) -> T:
        """``body`` on one connection inside one transaction, connection failures mapped;
        the whole transaction runs again when the database aborted it for contention, so
        ``body`` must leave nothing behind but its database writes and its result."""

        async def attempt() -> T:
            async with self.transaction() as con:
                return await body(con)

        return await self.contended(attempt, verb=verb)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.Connection]:
        """One connection inside one transaction, connection failures mapped (no retry on
        contention: ``in_transaction`` retries)."""
        pool = self._live
        try:
            async with pool.acquire() as con, con.transaction():
                yield con
        except NOT_MIGRATED as e:
            raise self.not_migrated(e) from e
        except UNAVAILABLE as e:
            if not is_outage(e):
                raise
            await self._expire(pool, e)
            raise self.unavailable(e) from e
