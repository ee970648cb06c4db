"""The million-run soak (not in CI): submit ``--runs`` runs in bulk, drain them with one
in-process replica of ``--slots`` slots on the standard loop, retention on, and plot
throughput and the worker's RSS over time to a PNG.

    .venv/bin/python bench/soak.py --dsn postgresql://postgres@127.0.0.1:5432/bench_soak \
        --runs 1000000 --png bench/results/soak_1m.png

Prints one ``RESULT {...}`` line: the rate in the first and last tenth of the drain (the
soak passes when the last is within 20 % of the first) and RSS at the start and end. The
PNG is drawn with matplotlib when it is installed, else by ``png_plot`` below (stdlib only).
The database must exist and be empty (the script migrates it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import struct
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from runq_bench import bulk_submit, inproc_worker, write_config

from runq.config import Config, load_config
from runq.metrics import RUNS_FINISHED
from runq.queue import Queue
from runq.seal import generate_key

SAMPLE_SECONDS = 1.0
#: Every this many samples the run table's live/dead tuples are read (one cheap statement).
TABLE_EVERY = 10
#: The migration's autovacuum_vacuum_threshold for the run table (scale factor 0).
VACUUM_THRESHOLD = 5000
TABLE_SQL = (
    "SELECT n_live_tup, n_dead_tup, pg_total_relation_size(relid) FROM pg_stat_user_tables "
    "WHERE schemaname = 'runq' AND relname = 'runs'"
)
RETENTION_SECONDS = 30.0
RETENTION_INTERVAL_SECONDS = 10.0


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def finished() -> float:
    return float(
        RUNS_FINISHED.labels(outcome="completed", termination_reason="completed")._value.get()
    )


def prepare(args: argparse.Namespace) -> Config:
    """The worker's config file (retention on), written before the loop starts."""
    workdir = Path(args.logdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "soak.toml"
    write_config(cfg, url=args.dsn, transport="postgres", concurrency=args.slots)
    # Retention on: final runs are purged while the drain goes on.
    text = cfg.read_text().replace(
        "max_queue_depth = 0\n",
        f"max_queue_depth = 0\nretention_seconds = {RETENTION_SECONDS}\n"
        f"retention_interval_seconds = {RETENTION_INTERVAL_SECONDS}\n",
    )
    cfg.write_text(text)
    os.environ["RUNQ_SEAL_KEY"] = generate_key()
    config = load_config(cfg)
    return config


async def soak(args: argparse.Namespace, config: Config) -> dict[str, Any]:
    async with Queue.open(config=config, migrate=True) as q:
        submit_rate = await bulk_submit(q, "noop", args.runs, 10_000)
        print(f"submitted {args.runs:,} at {submit_rate:,.0f}/s", flush=True)
    samples: list[tuple[float, float, float]] = []  # (seconds, runs finished, RSS MB)
    loads: list[float] = []  # 1-minute load average at each sample
    tables: list[dict[str, float]] = []  # the run table every TABLE_EVERY samples
    base = finished()
    watcher = await asyncpg.connect(args.dsn)
    vacuums: list[dict[str, float]] = []
    vacuumer = (
        asyncio.create_task(autovacuum_like(args.dsn, args.vacuum_naptime, vacuums))
        if args.vacuum_naptime
        else None
    )
    try:
        async with inproc_worker(config):
            t0 = time.monotonic()
            while True:
                await asyncio.sleep(SAMPLE_SECONDS)
                done = finished() - base
                samples.append((time.monotonic() - t0, done, rss_mb()))
                loads.append(os.getloadavg()[0])
                if len(samples) % TABLE_EVERY == 0:
                    tables.append(await table_sample(watcher, samples[-1][0]))
                if len(samples) % 30 == 0:
                    print(
                        f"  {done:,.0f} / {args.runs:,} after {samples[-1][0]:.0f} s, "
                        f"load {loads[-1]:.1f}, table {tables[-1]}",
                        flush=True,
                    )
                if done >= args.runs:
                    break
    finally:
        if vacuumer is not None:
            vacuumer.cancel()
        await watcher.close()
    if args.samples:
        args.samples.write_text(
            json.dumps({"samples": samples, "loads": loads, "tables": tables, "vacuums": vacuums})
        )
    result = summarize(args, samples, submit_rate, loads, tables)
    result["vacuums"] = len(vacuums)
    result["vacuum_seconds"] = round(sum(v["seconds"] for v in vacuums), 1)
    return result


#: The server settings the soak may change (ALTER SYSTEM takes no bind parameters).
SERVER_SETTINGS = {"autovacuum", "autovacuum_naptime"}


async def set_server(dsn: str, name: str, value: str) -> str:
    """Set a server setting (reloaded, no restart); returns the value it had."""
    assert name in SERVER_SETTINGS, name
    con = await asyncpg.connect(dsn)
    try:
        before: str = await con.fetchval(f"SHOW {name}")
        if not value.replace("s", "").isalnum():
            raise SystemExit(f"bad value for {name}: {value!r}")
        await con.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        await con.execute("SELECT pg_reload_conf()")
        print(f"{name} {before} -> {value}", flush=True)
        return before
    finally:
        await con.close()


async def autovacuum_like(dsn: str, naptime: float, log: list[dict[str, float]]) -> None:
    """What autovacuum would do with the migration's per-table settings, for a server
    where it is off: every ``naptime`` seconds (autovacuum_naptime), ``VACUUM ANALYZE``
    the run table when it has more than 5,000 dead tuples (autovacuum_vacuum_threshold
    with scale factor 0, cost delay 0)."""
    con = await asyncpg.connect(dsn)
    try:
        while True:
            await asyncio.sleep(naptime)
            await con.execute("SELECT pg_stat_clear_snapshot()")
            dead = await con.fetchval(
                "SELECT n_dead_tup FROM pg_stat_user_tables "
                "WHERE schemaname = 'runq' AND relname = 'runs'"
            )
            if dead > VACUUM_THRESHOLD:
                t0 = time.monotonic()
                await con.execute("VACUUM ANALYZE runq.runs")
                took = round(time.monotonic() - t0, 2)
                log.append({"at": time.time() - took, "dead": dead, "seconds": took})
                print(f"  vacuum: {dead:,} dead, {log[-1]['seconds']} s", flush=True)
    finally:
        await con.close()


async def table_sample(con: asyncpg.Connection, t: float) -> dict[str, float]:
    await con.execute("SELECT pg_stat_clear_snapshot()")
    live, dead, size = await con.fetchrow(TABLE_SQL)
    return {"t": round(t, 1), "live": live, "dead": dead, "mb": round(size / 1e6, 1)}


def rates(samples: list[tuple[float, float, float]]) -> list[tuple[float, float]]:
    out, prev_t, prev_n = [], 0.0, 0.0
    for t, n, _ in samples:
        out.append((t, (n - prev_n) / max(t - prev_t, 1e-9)))
        prev_t, prev_n = t, n
    return out


def summarize(
    args: argparse.Namespace,
    samples: list[tuple[float, float, float]],
    submit_rate: float,
    loads: list[float],
    tables: list[dict[str, float]],
) -> dict[str, Any]:
    tenth = max(len(samples) // 10, 1)
    r = [rate for _, rate in rates(samples)]
    first, last = statistics.mean(r[:tenth]), statistics.mean(r[-tenth:])
    plot(args.png, samples, f"runq soak: {args.runs:,} runs, {args.slots} slots", loads)
    return {
        "runs": args.runs,
        "submit_rate": round(submit_rate, 1),
        "drain_seconds": round(samples[-1][0], 1),
        "rate_first_tenth": round(first, 1),
        "rate_last_tenth": round(last, 1),
        "last_vs_first": round(last / first, 3) if first else None,
        "rss_mb_start": round(samples[0][2], 1),
        "rss_mb_end": round(samples[-1][2], 1),
        "rss_mb_max": round(max(s[2] for s in samples), 1),
        "rss_mb_first_tenth": round(statistics.mean(s[2] for s in samples[:tenth]), 1),
        "rss_mb_last_tenth": round(statistics.mean(s[2] for s in samples[-tenth:]), 1),
        "load_first_tenth": round(statistics.mean(loads[:tenth]), 2),
        "load_last_tenth": round(statistics.mean(loads[-tenth:]), 2),
        "load_mean": round(statistics.mean(loads), 2),
        "table_first": tables[0] if tables else None,
        "table_last": tables[-1] if tables else None,
        "table_max_dead": max((t["dead"] for t in tables), default=None),
        "png": str(args.png),
    }


# -- the plot ----------------------------------------------------------------------------------


def plot(
    path: Path,
    samples: list[tuple[float, float, float]],
    title: str,
    loads: list[float] | None = None,
) -> None:
    times = [t for t, _, _ in samples]
    rate = [x for _, x in rates(samples)]
    rss = [m for _, _, m in samples]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        png_plot(path, times, [rate, rss])
        return
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    top.plot(times, rate)
    top.set_ylabel("runs/s")
    if loads:
        # The machine is shared: the load average explains much of the rate's swings.
        load_axis = top.twinx()
        load_axis.plot(times, loads, color="tab:gray", linewidth=0.8)
        load_axis.set_ylabel("load average (1 min), grey")
    top.set_title(title)
    bottom.plot(times, rss, color="tab:red")
    bottom.set_ylabel("worker RSS, MB")
    bottom.set_xlabel("seconds")
    fig.savefig(path, dpi=100)


def png_plot(path: Path, xs: list[float], series: list[list[float]]) -> None:
    """Stacked line panels (throughput above, RSS below) as a PNG, with the stdlib only:
    each panel scaled from zero to its maximum, a grey baseline, the line in black."""
    width, panel = 800, 240
    height = panel * len(series)
    pixels = bytearray(b"\xff" * (width * height))
    span = max(xs[-1] - xs[0], 1e-9) if xs else 1.0

    def put(x: int, y: int, value: int) -> None:
        if 0 <= x < width and 0 <= y < height:
            pixels[y * width + x] = value

    for i, ys in enumerate(series):
        top, top_value = i * panel, max(max(ys, default=0.0), 1e-9)
        for x in range(width):
            put(x, top + panel - 1, 0xC0)
        prev: tuple[int, int] | None = None
        for x_value, y_value in zip(xs, ys, strict=True):
            px = int((x_value - xs[0]) / span * (width - 1))
            py = top + panel - 2 - int(y_value / top_value * (panel - 12))
            if prev is not None:
                steps = max(abs(px - prev[0]), abs(py - prev[1]), 1)
                for s in range(steps + 1):
                    put(
                        prev[0] + (px - prev[0]) * s // steps,
                        prev[1] + (py - prev[1]) * s // steps,
                        0,
                    )
            prev = (px, py)
    raw = b"".join(b"\x00" + bytes(pixels[y * width : (y + 1) * width]) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit greyscale
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def replot(samples_json: Path, png: Path, title: str) -> None:
    data = json.loads(samples_json.read_text())
    plot(png, [tuple(s) for s in data["samples"]], title, data.get("loads"))  # type: ignore[misc]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dsn", default="", help="an empty database")
    p.add_argument("--runs", type=int, default=1_000_000)
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--png", type=Path, default=common.BENCH_DIR / "results" / "soak.png")
    p.add_argument("--logdir", default="/tmp/runq-soak")
    p.add_argument(
        "--vacuum-naptime",
        type=float,
        default=0,
        help="emulate autovacuum (off on the bench machine) with this naptime, seconds",
    )
    p.add_argument(
        "--autovacuum",
        action="store_true",
        help="turn the server's autovacuum on for the soak (ALTER SYSTEM, a superuser), as"
        " production servers run it; the settings it had are restored at the end",
    )
    p.add_argument(
        "--autovacuum-naptime",
        type=int,
        default=0,
        help="with --autovacuum: the server's autovacuum_naptime for the soak, seconds"
        " (0: leave it; PostgreSQL's default is 60)",
    )
    p.add_argument(
        "--samples", type=Path, default=None, help="also write every sample to this JSON file"
    )
    p.add_argument("--replot", type=Path, default=None, help="only redraw --png from this JSON")
    p.add_argument("--title", default="runq soak: 1,000,000 runs, 16 slots")
    args = p.parse_args()
    if args.replot:
        replot(args.replot, args.png, args.title)
        return
    config = prepare(args)
    if not args.autovacuum:
        common.emit(asyncio.run(soak(args, config)))
        return
    before = asyncio.run(set_server(args.dsn, "autovacuum", "on"))
    naptime = args.autovacuum_naptime
    old_naptime = (
        asyncio.run(set_server(args.dsn, "autovacuum_naptime", str(naptime))) if naptime else None
    )
    try:
        result = asyncio.run(soak(args, config))
        result["autovacuum"] = "on (server)"
        result["autovacuum_naptime"] = naptime or "server default"
        common.emit(result)
    finally:
        asyncio.run(set_server(args.dsn, "autovacuum", before))
        if old_naptime is not None:
            asyncio.run(set_server(args.dsn, "autovacuum_naptime", old_naptime))


if __name__ == "__main__":
    main()
