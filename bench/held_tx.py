"""Held-transaction recovery (not in CI): a drain during which another connection holds a
transaction open and idle, then releases it.

    .venv/bin/python bench/held_tx.py --runs 600000 --before 60 --hold 60 --after 60

One in-process replica of ``--slots`` slots (standard loop, retention off) drains a bulk
backlog of no-op runs. A probe producer submits ``--probe-rate`` runs per second at
priority -1 (ahead of the backlog), so a probe's pickup latency (``started_at`` minus
``created_at``, both the database's clock) is the time from submission to the first claim
pass that sees it: the claim path's own latency, not the backlog's. ``--before`` seconds
into the drain, another connection runs ``BEGIN; SELECT txid_current();`` and stays idle
in the transaction for ``--hold`` seconds (pinning the xmin horizon: no row version
deleted after it may be removed, by vacuum or by index-entry killing), then commits; the
drain goes on for ``--after`` seconds.

Reports per phase (before, during, after) the drain rate and the probes' p50/p99 pickup
latency, the rate per 5-second window, how long after the release the rate came back to
95 % of the baseline (5-second windows), ``n_tup_upd`` / ``n_tup_hot_upd`` of the run
table across the drain, and the plans of the claim and completion statements (EXPLAIN
(ANALYZE, BUFFERS), in a rolled-back transaction) before the hold, at its end and after
it. The scratch database is recreated and dropped at the end unless ``--keep``.
Prints the plans on stderr and one ``RESULT {...}`` line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from fleet_sim import drop_database, dsn_for, fresh_database
from runq_bench import bulk_submit, inproc_worker, write_config
from soak import autovacuum_like

from runq.config import Config, load_config
from runq.metrics import RUNS_FINISHED
from runq.queue import Queue
from runq.seal import generate_key

WINDOW = 5.0
EXPLAINER = "explainer"
TABLE_SQL = (
    "SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, n_tup_del "
    "FROM pg_stat_user_tables WHERE schemaname = 'runq' AND relname = 'runs'"
)


def finished() -> float:
    return float(
        RUNS_FINISHED.labels(outcome="completed", termination_reason="completed")._value.get()
    )


async def table_stats(con: asyncpg.Connection) -> dict[str, int]:
    await con.execute("SELECT pg_stat_clear_snapshot()")
    return dict(await con.fetchrow(TABLE_SQL))


async def plans(con: asyncpg.Connection, q: Queue, label: str) -> dict[str, Any]:
    """Claim 16 runs, EXPLAIN the completion of those 16, then EXPLAIN a second claim of
    16; all rolled back. Returns the execution times and buffers; prints the plans."""
    sql = q.store.statements  # type: ignore[attr-defined]
    rules: tuple[object, ...] = (True, [], [], [], [])
    out: dict[str, Any] = {}
    tr = con.transaction()
    await tr.start()
    try:
        claimed = await con.fetch(sql.claim, EXPLAINER, 16, *rules)
        ids = [r["id"] for r in claimed]
        attempts = [r["attempt"] for r in claimed]
        complete = await con.fetch(
            "EXPLAIN (ANALYZE, BUFFERS) " + sql.complete,
            EXPLAINER,
            ids,
            attempts,
            [None] * len(ids),
            ["completed"] * len(ids),
        )
        claim = await con.fetch("EXPLAIN (ANALYZE, BUFFERS) " + sql.claim, EXPLAINER, 16, *rules)
    finally:
        await tr.rollback()
    for name, rows in (("claim", claim), ("complete", complete)):
        text = "\n".join(r[0] for r in rows)
        print(f"\n### {label}: {name}\n\n```\n{text}\n```", file=sys.stderr, flush=True)
        out[name] = summary(text)
    return out


def summary(plan: str) -> dict[str, Any]:
    """Execution time and the top node's shared buffers of a plan's text."""
    ms = next(
        (float(line.split()[-2]) for line in plan.splitlines() if "Execution Time" in line), None
    )
    hits = next((line.strip() for line in plan.splitlines() if "Buffers:" in line), "")
    return {"ms": ms, "buffers": hits}


def percentile(values: list[float], p: float) -> float | None:
    return round(common.percentile(sorted(values), p) * 1000, 1) if values else None


async def probes(q: Queue, rate: float, stop: asyncio.Event) -> int:
    n = 0
    interval = 1.0 / rate
    nxt = time.monotonic()
    while not stop.is_set():
        await q.defer("task", "noop", {"probe": n}, priority=-1)
        n += 1
        nxt += interval
        await asyncio.sleep(max(nxt - time.monotonic(), 0))
    return n


async def hold(dsn: str, seconds: float, marks: dict[str, float]) -> None:
    con = await asyncpg.connect(dsn)
    try:
        tr = con.transaction()
        await tr.start()
        marks["xid"] = float(await con.fetchval("SELECT txid_current()"))
        marks["hold_start"] = time.time()
        await asyncio.sleep(seconds)  # idle in transaction: the point of the exercise
        await tr.commit()
        marks["hold_end"] = time.time()
    finally:
        await con.close()


def phase_of(t: float, marks: dict[str, float], after: float) -> str | None:
    if t < marks["hold_start"]:
        return "before"
    if t < marks["hold_end"]:
        return "during"
    if t < marks["hold_end"] + after:
        return "after"
    return None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    db_dsn = dsn_for(args.dsn, args.db)
    await fresh_database(args.dsn, args.db, log_statements=False)
    config = prepare(args, db_dsn)
    con = await asyncpg.connect(db_dsn)
    marks: dict[str, float] = {}
    samples: list[tuple[float, float]] = []  # (wall time, runs finished)
    plan_times: dict[str, Any] = {}
    async with Queue.open(config=config, migrate=True) as q:
        rate = await bulk_submit(q, "noop", args.runs, 10_000)
        common.log(f"submitted {args.runs:,} at {rate:,.0f}/s")
        await con.execute("VACUUM ANALYZE runq.runs")
        t_before = await table_stats(con)
        base = finished()
        stop = asyncio.Event()
        vacuums: list[dict[str, float]] = []
        vacuumer = (
            asyncio.create_task(autovacuum_like(db_dsn, args.vacuum_naptime, vacuums))
            if args.vacuum_naptime
            else None
        )
        async with inproc_worker(config):
            probe_task = asyncio.create_task(probes(q, args.probe_rate, stop))
            start = time.time()
            total = args.before + args.hold + args.after
            holder: asyncio.Task[None] | None = None
            explained: set[str] = set()
            while time.time() - start < total:
                await asyncio.sleep(1.0)
                now = time.time()
                samples.append((now, finished() - base))
                if holder is None and now - start >= args.before:
                    plan_times["before"] = await plans(con, q, "before the hold")
                    holder = asyncio.create_task(hold(db_dsn, args.hold, marks))
                held = now - marks.get("hold_start", now)
                if "end" not in explained and held >= args.hold - 3:
                    explained.add("end")
                    plan_times["hold_end"] = await plans(con, q, "at the hold's end")
                    marks["dead_at_hold_end"] = (await table_stats(con))["n_dead_tup"]
                released = now - marks.get("hold_end", now)
                if "after" not in explained and released >= 10:
                    explained.add("after")
                    plan_times["after"] = await plans(con, q, "10 s after release")
                if samples[-1][1] >= args.runs - 1000:
                    raise RuntimeError("the backlog ran out: raise --runs")
            stop.set()
            n_probes = await probe_task
            if holder is not None:
                await holder
            if vacuumer is not None:
                vacuumer.cancel()
        t_after = await table_stats(con)
        latencies = await con.fetch(
            "SELECT created_at, started_at - created_at AS wait FROM runq.runs "
            "WHERE priority = -1 AND started_at IS NOT NULL"
        )
    await con.close()
    result = summarize(args, samples, marks, latencies, n_probes)
    result["table"] = {
        "n_tup_upd": t_after["n_tup_upd"] - t_before["n_tup_upd"],
        "n_tup_hot_upd": t_after["n_tup_hot_upd"] - t_before["n_tup_hot_upd"],
        "n_dead_tup_end": t_after["n_dead_tup"],
        "n_dead_tup_at_hold_end": marks.get("dead_at_hold_end"),
    }
    result["plans"] = plan_times
    result["vacuums"] = [{**v, "at": round(v["at"] - marks["hold_start"], 1)} for v in vacuums]
    if args.samples:
        write_samples(args.samples, samples, marks)
    if not args.keep:
        await drop_database(args.dsn, args.db)
    return result


def write_samples(path: Path, samples: list[tuple[float, float]], marks: dict[str, float]) -> None:
    path.write_text(json.dumps({"samples": samples, "marks": marks}))


def prepare(args: argparse.Namespace, dsn: str) -> Config:
    workdir = Path(args.logdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "held.toml"
    write_config(cfg, url=dsn, transport="postgres", concurrency=args.slots)
    os.environ["RUNQ_SEAL_KEY"] = generate_key()
    return load_config(cfg)


def windows(samples: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(window start, runs/s) over consecutive WINDOW-second windows of the 1 s samples."""
    out = []
    i = 0
    while i < len(samples):
        j = i
        while j + 1 < len(samples) and samples[j + 1][0] - samples[i][0] <= WINDOW:
            j += 1
        if j == i:
            break
        (t0, n0), (t1, n1) = samples[i], samples[j]
        out.append((t0, (n1 - n0) / (t1 - t0)))
        i = j
    return out


def summarize(
    args: argparse.Namespace,
    samples: list[tuple[float, float]],
    marks: dict[str, float],
    latencies: list[asyncpg.Record],
    n_probes: int,
) -> dict[str, Any]:
    per_window = windows(samples)
    by_phase: dict[str, list[float]] = {"before": [], "during": [], "after": []}
    for t, r in per_window:
        ph = phase_of(t, marks, args.after)
        if ph:
            by_phase[ph].append(r)
    # The first window of the drain includes the worker's start-up: left out of the baseline.
    baseline = statistics.mean(by_phase["before"][1:]) if len(by_phase["before"]) > 1 else None
    recovered = None
    if baseline:
        for t, r in per_window:
            if t >= marks["hold_end"] and r >= 0.95 * baseline:
                recovered = round(t + WINDOW - marks["hold_end"], 1)
                break
    waits: dict[str, list[float]] = {"before": [], "during": [], "after": []}
    # created_at is the database's clock, samples are this process's: same machine.
    for row in latencies:
        ph = phase_of(row["created_at"], marks, args.after)
        if ph:
            waits[ph].append(row["wait"])
    return {
        "runs": args.runs,
        "slots": args.slots,
        "probes": n_probes,
        "hold_seconds": round(marks["hold_end"] - marks["hold_start"], 1),
        "baseline_rate": round(baseline, 1) if baseline else None,
        "phases": {
            ph: {
                "rate": round(statistics.mean(by_phase[ph]), 1) if by_phase[ph] else None,
                "rate_min": round(min(by_phase[ph]), 1) if by_phase[ph] else None,
                "probe_p50_ms": percentile(waits[ph], 50),
                "probe_p99_ms": percentile(waits[ph], 99),
                "probes": len(waits[ph]),
            }
            for ph in by_phase
        },
        "seconds_to_95pct_after_release": recovered,
        "windows": [(round(t - marks["hold_start"], 1), round(r, 1)) for t, r in per_window],
        "load_now": os.getloadavg(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/test", help="admin")
    p.add_argument("--db", default="bench_heldtx")
    p.add_argument("--runs", type=int, default=600_000)
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--before", type=float, default=60)
    p.add_argument("--hold", type=float, default=60)
    p.add_argument("--after", type=float, default=60)
    p.add_argument("--probe-rate", type=float, default=20)
    p.add_argument("--samples", type=Path, default=None)
    p.add_argument(
        "--vacuum-naptime",
        type=float,
        default=0,
        help="emulate autovacuum (off on the bench machine) with this naptime, seconds",
    )
    p.add_argument("--keep", action="store_true")
    p.add_argument("--logdir", default="/tmp/runq-heldtx")
    common.emit(asyncio.run(run(p.parse_args())))


if __name__ == "__main__":
    main()
