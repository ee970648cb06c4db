"""W5's floor: the least an HTTP submission can cost on runq's server stack, without runq.

    .venv/bin/python bench/w5/floor_app.py --url postgresql://... --port 8123 [--framework asgi]
    .venv/bin/python bench/w5/floor_app.py --url sqlite:////tmp/w5.db --port 8123

The same stack as ``runq serve``'s HTTP API: uvicorn, one process, uvloop, uvicorn's h11
protocol, no access log; by default a Litestar app (runq's framework) whose request bodies
are msgspec Structs, or (``--framework asgi``) a bare ASGI callable that decodes the JSON
with msgspec itself, to show the framework's share. It serves what W5 asks of runq:

- ``POST /runs``: one INSERT of a queued run row into runq's own ``runs`` table (the schema
  ``runq migrate`` made, so the database pays for the same indexes and triggers), one
  autocommit round trip; answers 202 with ``run_id``, ``status`` and ``created`` as runq.
- ``POST /runs/batch``: the items in one multi-row INSERT (PostgreSQL: ``unnest`` of arrays;
  SQLite: ``executemany`` in one transaction); 202 with one answer per item.
- ``GET /runs/{id}``: the row by primary key as JSON (404 when absent).
- ``GET /healthz``: 200.

No runq code is imported: what runq adds on top (validation rules, idempotency and depth
gates, sealing, auth, wake-ups, logging, middleware) is the difference W5 measures. The
payload is stored as plain JSON bytes (runq seals it). PostgreSQL: an asyncpg pool of 10
(runq's default ``[store] pool_size``); SQLite: one writer and one reader connection with
runq's pragmas (WAL, ``synchronous = NORMAL``), as runq's SQLite store holds them.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiosqlite
import asyncpg
import msgspec
import uvicorn
from litestar import Litestar, Response, get, post

COLUMNS = (
    "id, component_type, component_id, status, attempt, max_attempts, priority, actor, "
    "deployment_id, origin, created_at, updated_at, available_at, has_request, payload"
)
READ_COLUMNS = (
    "id, component_type, component_id, status, attempt, max_attempts, priority, session_id, "
    "user_id, deployment_id, origin, created_at, updated_at, available_at, started_at, "
    "completed_at, error, termination_reason, payload"
)
ACTOR = '{"user_id":null,"scopes":[]}'
POOL_SIZE = 10
SQLITE_PRAGMAS = (
    "PRAGMA busy_timeout = 30000",
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = NORMAL",
    "PRAGMA temp_store = MEMORY",
)


class Submission(msgspec.Struct, forbid_unknown_fields=True):
    component_type: str
    component_id: str
    payload: Any = None
    background: bool = True


class Item(msgspec.Struct, forbid_unknown_fields=True):
    component_type: str
    component_id: str
    payload: Any = None


class Batch(msgspec.Struct):
    items: list[Item]


class Accepted(msgspec.Struct):
    run_id: str
    session_id: str | None
    status: str
    created: bool = True


class Store:
    """The floor's three statements on one engine."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def insert(self, rows: list[tuple[Any, ...]]) -> None: ...

    async def get(self, run_id: str) -> dict[str, Any] | None: ...


def row_of(item: Submission | Item, now: float) -> tuple[Any, ...]:
    return (
        str(uuid.uuid4()),
        item.component_type,
        item.component_id,
        ACTOR,
        now,
        msgspec.json.encode(item.payload),
    )


def decoded(row: dict[str, Any]) -> dict[str, Any]:
    raw = row.pop("payload")
    row["payload"] = msgspec.json.decode(raw) if raw is not None else None
    return row


class PostgresFloor(Store):
    def __init__(self, url: str, schema: str) -> None:
        self.url = url
        t = f"{schema}.runs"
        self.insert_one = (
            f"INSERT INTO {t} ({COLUMNS}) "
            "VALUES ($1, $2, $3, 'queued', 0, 1, 0, $4, '', 'http', $5, $5, $5, true, $6)"
        )
        self.insert_many = (
            f"INSERT INTO {t} ({COLUMNS}) "
            "SELECT i, ct, ci, 'queued', 0, 1, 0, a, '', 'http', n, n, n, true, p "
            "FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::float8[], "
            "$6::bytea[]) AS v(i, ct, ci, a, n, p)"
        )
        self.select = f"SELECT {READ_COLUMNS} FROM {t} WHERE id = $1"
        self.pool: asyncpg.Pool | None = None

    async def open(self) -> None:
        self.pool = await asyncpg.create_pool(self.url, min_size=POOL_SIZE, max_size=POOL_SIZE)

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    async def insert(self, rows: list[tuple[Any, ...]]) -> None:
        assert self.pool is not None
        if len(rows) == 1:
            await self.pool.execute(self.insert_one, *rows[0])
        else:
            await self.pool.execute(
                self.insert_many, *(list(col) for col in zip(*rows, strict=True))
            )

    async def get(self, run_id: str) -> dict[str, Any] | None:
        assert self.pool is not None
        row = await self.pool.fetchrow(self.select, run_id)
        return decoded(dict(row)) if row is not None else None


class SqliteFloor(Store):
    def __init__(self, path: str, schema: str) -> None:
        self.path = path
        t = f"{schema}_runs"
        self.insert_sql = (
            f"INSERT INTO {t} ({COLUMNS}) "
            "VALUES (?, ?, ?, 'queued', 0, 1, 0, ?, '', 'http', ?5, ?5, ?5, 1, ?)"
        )
        self.select = f"SELECT {READ_COLUMNS} FROM {t} WHERE id = ?"
        self.writer: aiosqlite.Connection | None = None
        self.reader: aiosqlite.Connection | None = None
        # One writer connection: a batch's transaction must not take in another request's
        # statements (runq's SQLite store serializes its writes the same way).
        self.write_lock = asyncio.Lock()

    async def _connect(self, *, query_only: bool) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None, cached_statements=256)
        conn.row_factory = sqlite3.Row
        for pragma in (*SQLITE_PRAGMAS, *(("PRAGMA query_only = 1",) if query_only else ())):
            await conn.execute(pragma)
        return conn

    async def open(self) -> None:
        self.writer = await self._connect(query_only=False)
        self.reader = await self._connect(query_only=True)

    async def close(self) -> None:
        for conn in (self.reader, self.writer):
            if conn is not None:
                await conn.close()

    async def insert(self, rows: list[tuple[Any, ...]]) -> None:
        assert self.writer is not None
        async with self.write_lock:
            if len(rows) == 1:
                await self.writer.execute(self.insert_sql, rows[0])
                return
            # One transaction per batch, as a batch is stored all or none.
            await self.writer.execute("BEGIN IMMEDIATE")
            try:
                await self.writer.executemany(self.insert_sql, rows)
            except BaseException:
                await self.writer.execute("ROLLBACK")
                raise
            await self.writer.execute("COMMIT")

    async def get(self, run_id: str) -> dict[str, Any] | None:
        assert self.reader is not None
        async with self.reader.execute(self.select, (run_id,)) as cur:
            row = await cur.fetchone()
        return decoded(dict(row)) if row is not None else None


def store_for(url: str, schema: str) -> Store:
    if url.startswith("sqlite:///"):
        return SqliteFloor(url.removeprefix("sqlite:///"), schema)
    return PostgresFloor(url, schema)


# -- the Litestar app ------------------------------------------------------------------------


def litestar_app(store: Store) -> Litestar:
    @post("/runs", status_code=202)
    async def submit(data: Submission) -> Accepted:
        row = row_of(data, time.time())
        await store.insert([row])
        return Accepted(run_id=row[0], session_id=None, status="queued")

    @post("/runs/batch", status_code=202)
    async def submit_batch(data: Batch) -> dict[str, list[Accepted]]:
        now = time.time()
        rows = [row_of(item, now) for item in data.items]
        await store.insert(rows)
        return {"items": [Accepted(run_id=r[0], session_id=None, status="queued") for r in rows]}

    @get("/runs/{run_id:str}")
    async def read(run_id: str) -> Response[Any]:
        row = await store.get(run_id)
        if row is None:
            return Response({"error": "not_found"}, status_code=404)
        return Response(row)

    @get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return Litestar(
        route_handlers=[submit, submit_batch, read, healthz],
        on_startup=[store.open],
        on_shutdown=[store.close],
        openapi_config=None,
    )


# -- the bare ASGI app -----------------------------------------------------------------------

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]
JSON_HEADERS = [(b"content-type", b"application/json")]


async def read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def answer(send: Send, status: int, body: Any) -> None:
    raw = msgspec.json.encode(body)
    headers = [*JSON_HEADERS, (b"content-length", str(len(raw)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": raw})


def asgi_app(store: Store) -> Any:
    submission = msgspec.json.Decoder(Submission)
    batch = msgspec.json.Decoder(Batch)

    async def lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await store.open()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await store.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        method, path = scope["method"], scope["path"]
        try:
            if method == "POST" and path == "/runs":
                row = row_of(submission.decode(await read_body(receive)), time.time())
                await store.insert([row])
                await answer(send, 202, Accepted(run_id=row[0], session_id=None, status="queued"))
            elif method == "POST" and path == "/runs/batch":
                now = time.time()
                rows = [row_of(i, now) for i in batch.decode(await read_body(receive)).items]
                await store.insert(rows)
                items = [Accepted(run_id=r[0], session_id=None, status="queued") for r in rows]
                await answer(send, 202, {"items": items})
            elif method == "GET" and path.startswith("/runs/"):
                found = await store.get(path.removeprefix("/runs/"))
                await answer(send, 200 if found else 404, found or {"error": "not_found"})
            elif method == "GET" and path == "/healthz":
                await answer(send, 200, {"status": "ok"})
            else:
                await answer(send, 404, {"error": "not_found"})
        except msgspec.DecodeError as e:  # a bad body is a 400, as in runq
            await answer(send, 400, {"error": "bad_request", "detail": str(e)})

    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="postgresql://... or sqlite:////path.db")
    p.add_argument("--schema", default="runq")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--framework", choices=["litestar", "asgi"], default="litestar")
    args = p.parse_args()
    store = store_for(args.url, args.schema)
    app = litestar_app(store) if args.framework == "litestar" else asgi_app(store)
    # runq serve: uvicorn embedded on uvloop, h11, lifespan on, no access log, one process.
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="h11",
        lifespan="on",
        access_log=False,
        log_level="warning",
        workers=1,
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
