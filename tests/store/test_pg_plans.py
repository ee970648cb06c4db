"""Plans made on an empty table stay right as it grows (PostgreSQL).

runq's connections keep one generic plan per prepared statement, made at its first
execution. The test makes those plans where they are hardest to get right: a fresh schema
(``runq migrate``, which analyzes every table: the planner then knows the table is empty),
a connection with runq's own session settings, every hot statement planned there while the
run table is empty. Then the table grows to ``ROWS`` runs without ``ANALYZE`` (autovacuum
off for the cluster and for the table), and each statement's cached plan runs on the same
connection under ``EXPLAIN (ANALYZE, BUFFERS)``: the buffers it touches must stay within
``bound(rows)``, far below one pass over the table. The table's shape is a queue's: mostly
final runs, a backlog, and leases of one worker.

The cluster is a private one (``pg_clusters``): on the shared server another test's DDL can
reset this backend's caches and re-plan the statements on the grown table, which would let
the test pass for the wrong reason. A canary proves the plans were kept (``_plant_canary``).

``RUNQ_PLAN_REPORT=1`` prints the buffers per call of each statement.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest
from conftest import new_schema_name
from pgcluster import PgCluster, PgClusterFactory

from runq.ids import new_run_id
from runq.model import NewRun
from runq.seal import KeyRing
from runq.store import make_store
from runq.store.base import Store
from runq.store.postgres.connection import session_settings

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

ROWS = 100_000
QUEUED = 2_000
CLAIMED = 64
BATCH = 16
WORKER = "worker-plans"
TEST_KEY = b"k" * 32


def bound(rows: int) -> int:
    """Buffers a statement touching ``rows`` runs may read: a primary-key probe and the
    index entries of each row it writes (about 30 with runq's indexes), and some slack. One
    pass over the grown table reads thousands."""
    return 40 * rows + 100


def literal(value: Any) -> str:
    """An SQL literal for an EXECUTE argument (the statement's parameter types decide)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, bytes):
        return "'\\x" + value.hex() + "'"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, (list, tuple)):
        return literal("{" + ",".join(_array_item(x) for x in value) + "}")
    raise TypeError(f"no literal for {value!r}")


def _array_item(value: Any) -> str:
    if value is None:
        return "NULL"
    text = "\\\\x" + value.hex() if isinstance(value, bytes) else str(value)
    return '"' + text.replace('"', '\\"') + '"'


def buffers(plan: dict[str, Any]) -> int:
    """Shared buffers the statement touched: its top node, plus the data-modifying CTEs
    no node reads (PostgreSQL runs those after the main plan, outside its counts)."""
    top = plan["Plan"]
    read: set[str] = set()
    stack = [top]
    while stack:
        node = stack.pop()
        stack.extend(node.get("Plans", []))
        if "CTE Name" in node:
            read.add(node["CTE Name"])

    def of(node: dict[str, Any]) -> int:
        return int(node["Shared Hit Blocks"]) + int(node["Shared Read Blocks"])

    unread = [
        child
        for child in top.get("Plans", [])
        if child.get("Subplan Name", "").startswith("CTE ")
        and child["Subplan Name"][4:] not in read
    ]
    return of(top) + sum(of(child) for child in unread)


@dataclass
class Hot:
    """One hot statement: its name, text, arguments, and how many runs it touches."""

    name: str
    sql: str
    args: Sequence[Any]
    rows: int

    def execute(self) -> str:
        if not self.args:
            return f"EXECUTE {self.name}"
        return f"EXECUTE {self.name}({', '.join(literal(a) for a in self.args)})"


@dataclass
class Grown:
    """Runs of the grown table the statements act on."""

    leased: list[str]  # claimed by WORKER, attempt 1, in id order
    queued: str
    final: str


@pytest.fixture
async def plan_cluster(pg_clusters: PgClusterFactory) -> PgCluster:
    return await pg_clusters.start(settings={"autovacuum": "off"})


@pytest.fixture
async def plan_store(plan_cluster: PgCluster) -> AsyncIterator[Store]:
    store = make_store(plan_cluster.url, schema=new_schema_name(), sealer=KeyRing([TEST_KEY]))
    await store.connect()
    await store.migrate()
    try:
        yield store
    finally:
        await store.close()


async def _grow(store: Store, url: str, schema: str) -> Grown:
    """``ROWS`` runs: final ones inserted in bulk, a backlog submitted, leases claimed."""
    conn = await asyncpg.connect(url)
    try:
        now = time.time()
        await conn.execute(
            f"""
            INSERT INTO {schema}.runs (id, component_type, component_id, status, attempt,
                max_attempts, actor, origin, created_at, updated_at, available_at, started_at,
                completed_at, termination_reason, answer)
            SELECT '0000' || lpad(g::text, 12, '0'), 'task', 'echo', 'completed', 1, 1,
                '{{}}', 'api', $1 - $2 + g, $1, $1 - $2 + g, $1, $1 - $2 + g, 'completed',
                '\\x00'::bytea
            FROM generate_series(1, $2::int) AS g""",
            now,
            ROWS - QUEUED,
        )
    finally:
        await conn.close()
    backlog = [NewRun(component_type="task", component_id="echo", payload=i) for i in range(QUEUED)]
    queued = await store.submit_many(backlog)
    claimed = await store.claim(WORKER, CLAIMED, deployment_id=None)
    taken = {run.id for run in claimed}
    last_queued = max(i for i in queued if i not in taken)
    return Grown(leased=sorted(taken), queued=last_queued, final="0000" + "1".zfill(12))


def _statements(store: Store, grown: Grown | None) -> list[Hot]:
    """Every hot statement with its arguments: on the empty table when ``grown`` is None
    (ids that do not exist), else on the grown one."""
    sql = store.statements  # type: ignore[attr-defined]
    none = [[], [], [], []]  # nothing blocked by the budget
    g = grown or Grown(leased=[f"absent-{i}" for i in range(BATCH)], queued="q", final="f")
    ids, attempts = g.leased[:BATCH], [1] * BATCH
    one = ids[0]
    submit_args = [
        "task",
        "echo",
        1,
        0,
        None,
        None,
        '{"kind":"anonymous"}',
        None,
        "",
        None,
        "api",
        0.0,
        True,
        b"payload",
        0,
        None,
        None,
        0,
        0,
        None,
    ]
    completions = [WORKER, ids, attempts, [None] * BATCH, ["completed"] * BATCH]
    return [
        Hot("claim", sql.claim, [WORKER, BATCH, True, *none], BATCH),
        Hot("claim_head", sql.claim_head, [], 1),
        Hot("claim_from_head", sql.claim_from_head,
            [WORKER, BATCH, True, *none, 0, 0.0, ""], BATCH),
        Hot("claim_one", sql.claim_one, [WORKER, g.queued, True, *none, ""], 1),
        Hot("heartbeat", sql.heartbeat, [WORKER, ids, attempts], BATCH),
        Hot("complete", sql.complete, completions, BATCH),
        Hot(
            "events_complete_one",
            sql.events_complete_one,
            [*completions, [0] * BATCH, [0] * BATCH, [], [], [], [], [], []],
            BATCH,
        ),
        Hot("fail", sql.fail, [one, 1, WORKER, True, 1.0, "e", None], 1),
        Hot("pause", sql.pause, [one, 1, WORKER, "approval", b"state", None], 1),
        Hot("settle_cancelled", sql.settle_cancelled, [one, 1, WORKER], 1),
        Hot("reap", sql.reap, [-3600.0, BATCH, "a", "b"], BATCH),
        Hot("release", sql.release, [WORKER, ids, attempts, [None] * BATCH], BATCH),
        Hot("events_reserve_many", sql.events_reserve_many,
            [WORKER, ids, attempts, [1] * BATCH], BATCH),
        Hot(
            "events_insert_many",
            sql.events_insert_many,
            [ids, attempts, [100] * BATCH, ["log"] * BATCH, [b"x"] * BATCH, "ch"],
            BATCH,
        ),
        Hot("events_list", sql.events_list, [one, 0, 100], 1),
        Hot("submit", sql.submit, [new_run_id(), *submit_args], 1),
        Hot("get", sql.get, [one], 1),
        Hot("cancel", sql.cancel, [g.queued], 1),
        Hot("requeue", sql.requeue, [g.final, False, True, 60.0], 1),
        Hot("purge", sql.purge, [0.0, BATCH], BATCH),
    ]  # fmt: skip


async def _connect(url: str, settings: dict[str, str]) -> asyncpg.Connection:
    return await asyncpg.connect(url, server_settings=settings, statement_cache_size=0)


async def _plant_canary(conn: asyncpg.Connection, schema: str) -> None:
    """A statement whose plan on an empty table differs from its plan on a full one: a
    lookup by key in a table of its own, planned on this connection with sequential scans
    allowed. It is grown with the run table; if it still scans at the end, this connection
    kept the plans it made on the empty tables (nothing re-planned them meanwhile)."""
    await conn.execute(f"CREATE TABLE {schema}.plan_canary (id int PRIMARY KEY, pad text)")
    await conn.execute(f"ANALYZE {schema}.plan_canary")
    await conn.execute("SET enable_seqscan = on")
    await conn.execute(f"PREPARE canary AS SELECT * FROM {schema}.plan_canary WHERE id = $1")
    await conn.execute("EXPLAIN EXECUTE canary(1)")
    await conn.execute("RESET enable_seqscan")


async def _check_canary(conn: asyncpg.Connection, schema: str) -> None:
    await conn.execute(
        f"INSERT INTO {schema}.plan_canary SELECT g, repeat('x', 50) FROM generate_series(1, $1) g",
        ROWS,
    )
    pages = await conn.fetchval(f"SELECT pg_relation_size('{schema}.plan_canary') / 8192")
    found, _ = await _measure(conn, "EXECUTE canary(5)")
    assert found >= pages // 2, (
        f"the canary read {found} buffers of {pages} pages: the plans were made again on the "
        "grown tables, so this test proves nothing"
    )


async def _measure(conn: asyncpg.Connection, statement: str) -> tuple[int, str]:
    """(buffers, plan text) of one execution, rolled back."""
    tx = conn.transaction()
    await tx.start()
    try:
        found = await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}")
        plan = json.loads(found)[0]
        text = await conn.fetch(f"EXPLAIN (COSTS OFF) {statement}")
    finally:
        await tx.rollback()
    return buffers(plan), "\n".join(r[0] for r in text)


async def test_hot_statements_planned_on_an_empty_table_keep_their_index_paths(
    plan_cluster: PgCluster, plan_store: Store
) -> None:
    store, url = plan_store, plan_cluster.url
    schema = store.schema  # type: ignore[attr-defined]
    hot = await _connect(url, session_settings("runq-plans"))
    try:
        for table in ("runs", "run_events"):
            await hot.execute(f"ALTER TABLE {schema}.{table} SET (autovacuum_enabled = false)")
        # Planned on the empty table: EXPLAIN EXECUTE makes and caches the generic plan
        # without running the statement.
        for s in _statements(store, None):
            await hot.execute(f"PREPARE {s.name} AS {s.sql}")
            await hot.execute(f"EXPLAIN {s.execute()}")
        await _plant_canary(hot, schema)

        grown = await _grow(store, url, schema)
        pages = await hot.fetchval(f"SELECT pg_relation_size('{schema}.runs') / 8192")
        await _check_canary(hot, schema)
        measured = {}
        for s in _statements(store, grown):
            found, text = await _measure(hot, s.execute())
            measured[s.name] = (found, bound(s.rows), text)
    finally:
        await hot.close()

    report = [f"{ROWS} runs, {pages} pages; buffers per call (bound):"]
    report += [f"  {name:22} {n:6} ({limit})" for name, (n, limit, _) in measured.items()]
    if os.environ.get("RUNQ_PLAN_REPORT"):
        print("\n" + "\n".join(report))
    if os.environ.get("RUNQ_PLAN_REPORT") == "plans":
        print("\n".join(f"--- {name}\n{text}" for name, (_, _, text) in measured.items()))
    over = {name: (n, limit, text) for name, (n, limit, text) in measured.items() if n > limit}
    assert not over, "\n".join(
        [*report, *(f"--- {name}\n{text}" for name, (_, _, text) in over.items())]
    )


async def test_migrate_analyzes_every_table_it_creates(
    plan_cluster: PgCluster, plan_store: Store
) -> None:
    """``runq migrate`` leaves statistics behind: no table of the schema is "never
    analyzed" (reltuples -1) after it."""
    schema = plan_store.schema  # type: ignore[attr-defined]
    conn = await asyncpg.connect(plan_cluster.url)
    try:
        found = await conn.fetch(
            """SELECT c.relname, c.reltuples FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace
               WHERE n.nspname = $1 AND c.relkind = 'r'""",
            schema,
        )
    finally:
        await conn.close()
    assert {r["relname"] for r in found} >= {"runs", "run_events", "workers", "run_counts"}
    assert all(r["reltuples"] >= 0 for r in found), found
