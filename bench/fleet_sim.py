"""Fleet simulation (not in CI): ``--replicas`` ``runq serve`` processes of ``--slots``
slots each, on this machine, against one PostgreSQL database, draining ``--runs`` no-op
runs submitted in bulk beforehand.

    .venv/bin/python bench/fleet_sim.py --replicas 10 --slots 16 --runs 100000

Measures: the aggregate drain rate (completed runs over the database's completion window),
claim statements and *claim conflicts* (claims that returned fewer runs than asked, or
none, while the queue still held more claimable runs than were asked for), the peak number
of connections to the database (``pg_stat_activity`` sampled every 0.2 s), transactions
per 1,000 runs (``pg_stat_database``) and, with ``--count-statements``, the statements
PostgreSQL executed per run (``log_statement = 'all'`` set on the scratch database only,
counted from the server log; pg_stat_statements needs ``shared_preload_libraries``).

runq exposes no claim counter per statement (``runq_claims_total`` counts claimed runs),
so each replica is ``runq serve`` started through this script's ``replica`` role: it wraps
``PostgresStore.claim`` to count calls, the runs asked and got, and the wall time of every
short claim, writes those counts to a JSON file every 0.5 s, then runs the ``runq serve``
command line unchanged (uvloop, HTTP off, the bench components).

The scratch database is created (dropped first if it exists) and dropped at the end unless
``--keep``. Prints one ``RESULT {...}`` line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from runq_bench import bulk_submit, write_config

PG_LOG = Path("/var/log/postgresql/postgresql-15-main.log")
SAMPLE_SECONDS = 0.2


# -- the replica: runq serve with a counted claim ------------------------------------------------


def replica(config: str, counts_path: str) -> None:
    """``runq serve --config CONFIG`` with ``PostgresStore.claim`` counted."""
    from runq.cli import main as runq_main
    from runq.store.postgres.store import PostgresStore

    counts: dict[str, Any] = {"calls": 0, "asked": 0, "got": 0, "short": []}
    lock = threading.Lock()
    original = PostgresStore.claim

    async def counted(self: PostgresStore, worker_id: str, slots: int, **kw: Any) -> Any:
        runs = await original(self, worker_id, slots, **kw)
        with lock:
            counts["calls"] += 1
            counts["asked"] += slots
            counts["got"] += len(runs)
            if len(runs) < slots:
                counts["short"].append((time.time(), slots, len(runs)))
        return runs

    PostgresStore.claim = counted  # type: ignore[method-assign]

    def dump() -> None:
        while True:
            with lock:
                text = json.dumps(counts)
            tmp = Path(counts_path + ".tmp")
            tmp.write_text(text)
            tmp.replace(counts_path)  # a reader never sees it half-written
            time.sleep(0.5)

    threading.Thread(target=dump, daemon=True).start()
    sys.argv = ["runq", "serve", "--config", config, "--log-format", "json"]
    runq_main()


# -- the driver ----------------------------------------------------------------------------------


def dsn_for(admin_dsn: str, db: str) -> str:
    return admin_dsn.rsplit("/", 1)[0] + "/" + db


async def fresh_database(admin_dsn: str, db: str, *, log_statements: bool) -> None:
    con = await asyncpg.connect(admin_dsn)
    try:
        await con.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        await con.execute(f"CREATE DATABASE {db}")
        if log_statements:
            await con.execute(f"ALTER DATABASE {db} SET log_statement = 'all'")
    finally:
        await con.close()


async def drop_database(admin_dsn: str, db: str) -> None:
    con = await asyncpg.connect(admin_dsn)
    try:
        await con.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    finally:
        await con.close()


class Sampler:
    """Connections, the claimable backlog and load average over time, from one connection."""

    def __init__(self, con: asyncpg.Connection) -> None:
        self.con = con
        self.peak_connections = 0
        self.peak_by_state: dict[str, int] = {}
        self.backlog: list[tuple[float, int]] = []  # (wall time, queued runs)
        self.loads: list[float] = []

    async def sample(self) -> int:
        rows = await self.con.fetch(
            "SELECT coalesce(state, '?') AS state, count(*) AS n FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() GROUP BY 1"
        )
        total = sum(r["n"] for r in rows)
        if total > self.peak_connections:
            self.peak_connections = total
            self.peak_by_state = {r["state"]: r["n"] for r in rows}
        queued = int(
            await self.con.fetchval("SELECT count(*) FROM runq.runs WHERE status = 'queued'")
        )
        self.backlog.append((time.time(), queued))
        self.loads.append(os.getloadavg()[0])
        return queued


def claim_conflicts(
    counts: list[dict[str, Any]], backlog: list[tuple[float, int]]
) -> dict[str, int]:
    """Short claims (fewer runs than asked) taken while the sampled backlog, at the sample
    just after the claim, still held more queued runs than the claim asked for: the rows
    were there, the claim did not get them (all locked by other claimers, or committed
    away between its snapshot and its lock)."""

    def backlog_after(t: float) -> int:
        for ts, queued in backlog:
            if ts >= t:
                return queued
        return 0

    empty = short = 0
    for c in counts:
        for t, asked, got in c["short"]:
            if backlog_after(t) > asked:
                short += 1
                empty += got == 0
    return {"short_while_backlog": short, "empty_while_backlog": empty}


def start_replicas(args: argparse.Namespace, cfg: Path, workdir: Path) -> list[Any]:
    env = common.env_with(RUNQ_SEAL_KEY=os.environ["RUNQ_SEAL_KEY"])
    env["PYTHONPATH"] = str(common.BENCH_DIR)
    procs = []
    for i in range(args.replicas):
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "replica",
            "--config",
            str(cfg),
            "--counts",
            str(workdir / f"counts_{i}.json"),
        ]
        procs.append(common.start_process(cmd, env=env, log_path=workdir / f"replica_{i}.log"))
    return procs


async def tuple_counts(con: asyncpg.Connection) -> dict[str, dict[str, int]]:
    """Rows inserted, updated (HOT or not) and deleted so far, per table of the schema."""
    await con.execute("SELECT pg_stat_clear_snapshot()")
    rows = await con.fetch(
        "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del "
        "FROM pg_stat_user_tables WHERE schemaname = 'runq'"
    )
    return {r["relname"]: {k: int(r[k]) for k in list(r.keys())[1:]} for r in rows}


def per_run(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]], n: int
) -> dict[str, dict[str, float]]:
    """Row changes per completed run, for the tables that changed."""
    out = {}
    for table, counts in before.items():
        changed = {k: round((after[table][k] - v) / n, 3) for k, v in counts.items()}
        if any(changed.values()):
            out[table] = changed
    return out


def clean_workdir(workdir: Path) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    for old in workdir.glob("counts_*.json"):
        old.unlink()
    return workdir


def log_size() -> int:
    return PG_LOG.stat().st_size


def read_counts(workdir: Path) -> list[dict[str, Any]]:
    return [json.loads(f.read_text()) for f in sorted(workdir.glob("counts_*.json"))]


async def fleet(args: argparse.Namespace) -> dict[str, Any]:
    from runq.config import load_config
    from runq.queue import Queue
    from runq.seal import generate_key

    db_dsn = dsn_for(args.dsn, args.db)
    workdir = clean_workdir(Path(args.logdir))
    await fresh_database(args.dsn, args.db, log_statements=args.count_statements)
    cfg = workdir / "fleet.toml"
    write_config(cfg, url=db_dsn, transport="postgres", concurrency=args.slots)
    os.environ["RUNQ_SEAL_KEY"] = generate_key()
    config = load_config(cfg)
    async with Queue.open(config=config, migrate=True) as q:
        submit_rate = await bulk_submit(q, "noop", args.runs, 10_000)
    common.log(f"submitted {args.runs:,} at {submit_rate:,.0f}/s")
    con = await asyncpg.connect(db_dsn)
    await con.execute("VACUUM ANALYZE runq.runs")
    log_start = log_size() if args.count_statements else 0
    await con.execute("SELECT pg_stat_clear_snapshot()")
    x0 = int(await con.fetchval(common.XACT_SQL))
    tuples0 = await tuple_counts(con)
    sampler = Sampler(con)
    t0 = time.time()
    procs = start_replicas(args, cfg, workdir)
    try:
        deadline = time.monotonic() + args.timeout
        while True:
            await asyncio.sleep(SAMPLE_SECONDS)
            left = await con.fetchval(
                "SELECT count(*) FROM runq.runs WHERE status IN ('queued', 'running')"
            )
            await sampler.sample()
            if left == 0:
                break
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"replica {p.pid} exited {p.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{left} runs left after {args.timeout} s")
        await asyncio.sleep(1.0)  # one more dump of every replica's counts
    finally:
        codes = [common.stop_process(p) for p in procs]
    n, first, last = await con.fetchrow(
        "SELECT count(*), min(completed_at), max(completed_at) FROM runq.runs "
        "WHERE status = 'completed'"
    )
    await con.execute("SELECT pg_stat_clear_snapshot()")
    x1 = int(await con.fetchval(common.XACT_SQL))
    tuples1 = await tuple_counts(con)
    await con.close()
    counts = read_counts(workdir)
    statements = count_statements(args.db, log_start) if args.count_statements else None
    result = {
        "replicas": args.replicas,
        "slots": args.slots,
        "runs": args.runs,
        "completed": n,
        "submit_rate": round(submit_rate, 1),
        "drain_rate": round(n / (last - first), 1),
        "drain_seconds": round(last - first, 2),
        "start_to_done_seconds": round(last - t0, 2),
        "claim_calls": sum(c["calls"] for c in counts),
        "claimed": sum(c["got"] for c in counts),
        "runs_per_claim": round(sum(c["got"] for c in counts) / sum(c["calls"] for c in counts), 2),
        "short_claims": sum(len(c["short"]) for c in counts),
        **claim_conflicts(counts, sampler.backlog),
        "peak_connections": sampler.peak_connections,
        "peak_connections_by_state": sampler.peak_by_state,
        "xacts_per_1k_runs": round((x1 - x0) / n * 1000, 1),
        "tuples_per_run": per_run(tuples0, tuples1, n),
        "statements": statements,
        "statements_per_run": round(statements["total"] / n, 3) if statements else None,
        "load_mean": round(sum(sampler.loads) / len(sampler.loads), 2),
        "load_max": round(max(sampler.loads), 2),
        "replica_exit_codes": sorted(set(codes)),
    }
    if not args.keep:
        await drop_database(args.dsn, args.db)
    return result


def count_statements(db: str, offset: int) -> dict[str, Any]:
    """Statements the server logged for ``db`` since ``offset``, by kind. A log entry is a
    line with the ``user@db LOG:`` prefix plus its continuation lines (a statement's text
    spans lines); the extended protocol logs ``execute <name>: SQL``. The sampler's own
    reads are left out."""
    kinds: dict[str, int] = {}
    marker = f"@{db} LOG:  "
    for body in log_entries(offset, marker):
        if body.startswith("execute "):
            sql = body.split(": ", 1)[1] if ": " in body else ""
        elif body.startswith("statement: "):
            sql = body.removeprefix("statement: ")
        else:
            continue
        flat = " ".join(sql.split())
        if any(mine in flat for mine in SAMPLER_READS):
            continue
        kind = statement_kind(flat)
        kinds[kind] = kinds.get(kind, 0) + 1
    return {
        "total": sum(kinds.values()),
        "by_kind": dict(sorted(kinds.items(), key=lambda kv: -kv[1])),
    }


SAMPLER_READS = (
    "pg_stat_activity",
    "pg_stat_clear_snapshot",
    "xact_commit",
    "SELECT count(*) FROM runq.runs WHERE status",
)

#: (what the statement text starts with or contains, its name), first match wins.
KINDS = (
    ("WITH c AS MATERIALIZED", "claim"),
    ("SET status = 'completed'", "complete"),
    ("WITH w AS (UPDATE runq.workers", "heartbeat"),
    ("WITH victims AS", "retention purge"),
    ("BEGIN", "BEGIN"),
    ("COMMIT", "COMMIT"),
)


def statement_kind(flat: str) -> str:
    for needle, name in KINDS:
        if needle in flat[:300]:
            return name
    return " ".join(flat.split()[:3])[:40] or "?"


def log_entries(offset: int, marker: str) -> list[str]:
    """Bodies of the log entries with ``marker`` since ``offset``, continuation lines joined."""
    entries: list[str] = []
    current: list[str] | None = None
    with PG_LOG.open("rb") as f:
        f.seek(offset)
        for raw in f:
            line = raw.decode(errors="replace").rstrip("\n")
            if line[:2] == "20" and " [" in line[:40]:  # a new entry (timestamp prefix)
                if current is not None:
                    entries.append("\n".join(current))
                i = line.find(marker)
                current = [line[i + len(marker) :]] if i >= 0 else None
            elif current is not None:
                current.append(line)
    if current is not None:
        entries.append("\n".join(current))
    return entries


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "replica":
        r = argparse.ArgumentParser()
        r.add_argument("role")
        r.add_argument("--config", required=True)
        r.add_argument("--counts", required=True)
        ra = r.parse_args()
        replica(ra.config, ra.counts)
        return
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test", help="admin")
    p.add_argument("--db", default="bench_fleet", help="the scratch database (recreated)")
    p.add_argument("--replicas", type=int, default=10)
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--runs", type=int, default=100_000)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--count-statements", action="store_true")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--logdir", default="/tmp/runq-fleet")
    common.emit(asyncio.run(fleet(p.parse_args())))


if __name__ == "__main__":
    main()
