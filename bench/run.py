#!/usr/bin/env python3
"""The one bench command: runq against PgQueuer and Procrastinate, same machine, same run.

    python3 bench/run.py                 # full run: 3 repetitions, about 10 minutes on 2 cores
    python3 bench/run.py --quick         # smaller workloads, 1 repetition (development)
    python3 bench/run.py --only W1,W2    # a selection (W1 W2 W3 W4 floor mem)
    python3 bench/run.py --only W1 --variant inproc --repeat 1   # one quick look
    python3 bench/run.py --profile       # also py-spy the workers during one W1 drain
    python3 bench/run.py --only W5       # HTTP submission: wrk against runq serve and its floor
    python3 bench/run.py --only W6       # durable features: events, steps, children; DBOS
    python3 bench/run.py --only W1cold   # W1 on a pool opened against an empty table
    python3 bench/run.py --only W5,W6,W1cold --smoke   # seconds each: do the harnesses work?

Two variants of W1-W3: ``subprocess`` (runq as a ``runq serve`` subprocess on uvloop, the
peers' workers as their own subprocesses, PgQueuer on uvloop as ``pgq run``) and
``inproc`` (every worker hosted in the benchmark process on the standard asyncio loop,
drain timed from the first handler call to the last completion committed). Both report
worker CPU per run.

It re-executes itself with the project's .venv, creates bench/.peers/venv (the peers are
never dependencies of runq) and installs the peers there, then runs every workload for
every system, each in a fresh database on the local PostgreSQL (CREATE DATABASE ... DROP
after), interleaved (runq, pgqueuer, procrastinate, runq, ...) for each repetition.
Prints medians and runq/peer ratios as a table, and writes bench/results/latest.json
(and latest.md).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
VENV_PY = ROOT / ".venv" / "bin" / "python"

if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve() and VENV_PY.exists():
    os.execv(str(VENV_PY), [str(VENV_PY), *sys.argv])

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import asyncpg  # noqa: E402

PEERS_DIR = BENCH / ".peers"
PEER_VENV = PEERS_DIR / "venv"
PEER_PY = PEER_VENV / "bin" / "python"
PEER_PACKAGES = ["pgqueuer", "procrastinate", "asyncpg", "psutil", "uvloop"]
#: DBOS Transact (W6) in a venv of its own: its dependencies (SQLAlchemy, psycopg) stay
#: apart from the other peers' pins.
DBOS_VENV = PEERS_DIR / "dbos-venv"
DBOS_PY = DBOS_VENV / "bin" / "python"
DBOS_PACKAGES = ["dbos", "psutil"]
RESULTS = BENCH / "results"
DEFAULT_DSN = os.environ.get("RUNQ_BENCH_DSN", "postgresql://postgres@127.0.0.1:5432/test")

WORKLOADS = ["W1", "W2", "W3", "W4", "floor", "mem", "W5", "W6", "W1cold"]
#: W3's baseline: W1 with W3's run count on an empty table (what W3 is divided by, the
#: issue's "W1 (5k)"); measured whenever W3 is, just before it.
W3_BASE = "W3base"
#: W1cold's baseline: runq's normal W1 (submitted first, then the worker starts), measured
#: whenever W1cold is, just before it.
W1COLD_BASE = "W1coldbase"
#: W5's systems: (server, engine, auth). ``floor``: bench/w5/floor_app.py on Litestar;
#: ``asgi``: the same floor as a bare ASGI callable (``--w5-asgi``).
W5_SYSTEMS = {
    "runq_pg": ("runq", "postgres", "open"),
    "runq_pg_key": ("runq", "postgres", "key"),
    "floor_pg": ("floor", "postgres", "open"),
    "asgi_pg": ("asgi", "postgres", "open"),
    "runq_sqlite": ("runq", "sqlite", "open"),
    "floor_sqlite": ("floor", "sqlite", "open"),
    "asgi_sqlite": ("asgi", "sqlite", "open"),
}
W5_SCENARIOS = [(m, c) for m in ("post", "batch", "get") for c in (16, 64)]
#: W6's parts, each one measurement: (script, role, extra options).
W6_SYSTEMS: dict[str, tuple[str, str, list[str]]] = {
    "runq_w1": ("runq_bench", "W1", ["--component", "noop"]),
    "runq_w1_events": ("runq_bench", "W1", ["--component", "emit10"]),
    "runq_w1_step": ("runq_bench", "W1", ["--component", "step1"]),
    "dbos_w1": ("dbos", "w1", ["--steps-per-run", "0"]),
    "dbos_w1_step": ("dbos", "w1", ["--steps-per-run", "1"]),
    "runq_steps_pg": ("w6_runq", "steps", ["--engine", "postgres"]),
    "runq_steps_sqlite": ("w6_runq", "steps", ["--engine", "sqlite"]),
    "dbos_steps": ("dbos", "steps", []),
    "runq_replay_pg": ("w6_runq", "replay", ["--engine", "postgres"]),
    "dbos_recovery": ("dbos", "recovery", []),
    "runq_fanout_pg": ("w6_runq", "fanout", ["--engine", "postgres"]),
}
#: Workloads whose systems are not split by ``--variant``.
VARIANT_FREE = {"W5", "W6"}
VARIANTS = ["subprocess", "inproc"]
#: The system name of a worker hosted in the benchmark process (standard asyncio loop).
INPROC = "_inproc"
PEERS = ["runq", "pgqueuer", "procrastinate"]
SYSTEMS = {
    "W1": [*PEERS, *(s + INPROC for s in PEERS)],
    "W2": [*PEERS, *(s + INPROC for s in PEERS)],
    "W3": [*PEERS, *(s + INPROC for s in PEERS)],
    W3_BASE: [*PEERS, *(s + INPROC for s in PEERS)],
    "W4": ["runq"],
    "floor": ["floor", "floor_fused"],
    "mem": ["runq"],
    "W5": [s for s in W5_SYSTEMS if not s.startswith("asgi")],
    "W6": list(W6_SYSTEMS),
    "W1cold": ["runq", "runq" + INPROC],
    W1COLD_BASE: ["runq", "runq" + INPROC],
}


def variant_of(system: str) -> str:
    return "inproc" if system.endswith(INPROC) else "subprocess"


def label_of(system: str) -> str:
    base = system.removesuffix(INPROC)
    return f"{base} (in-process)" if system.endswith(INPROC) else base


TARGETS = [
    # (key, description, op, threshold)
    ("w1_drain_vs_pgqueuer", "W1 drain: runq / PgQueuer", ">=", 3.0),
    ("w1_submit_vs_pgqueuer", "W1 bulk submit: runq / PgQueuer", ">=", 1.0),
    ("w2_p50_vs_pgqueuer", "W2 p50 latency: runq / PgQueuer (lower is better)", "<=", 1.0),
    ("w2_p99_vs_pgqueuer", "W2 p99 latency: runq / PgQueuer (lower is better)", "<=", 1.0),
    ("w3_vs_w1", "W3 drain / W1 drain (runq)", ">=", 0.9),
    ("w4_sqlite_vs_pgqueuer_w1", "W4 SQLite drain / PgQueuer W1 drain", ">=", 1.0),
    ("w1_vs_floor", "runq W1 drain / floor", ">=", 0.6),
    ("mem_growth", "worker RSS after 100,000 / after 1,000", "<=", 1.5),
    # The decisive comparison: every worker in-process on the standard asyncio loop.
    ("inproc_w1_drain_vs_pgqueuer", "in-process W1 drain: runq / PgQueuer", ">=", 3.0),
    ("inproc_w1_submit_vs_pgqueuer", "in-process W1 bulk submit: runq / PgQueuer", ">=", 1.5),
    (
        "inproc_w1_cpu_vs_pgqueuer",
        "in-process W1 worker CPU per run: runq / PgQueuer (lower is better)",
        "<=",
        1.0,
    ),
    (
        "inproc_w2_p50_vs_pgqueuer",
        "in-process W2 p50: runq / PgQueuer (lower is better)",
        "<=",
        1.0,
    ),
    (
        "inproc_w2_p99_vs_pgqueuer",
        "in-process W2 p99: runq / PgQueuer (lower is better)",
        "<=",
        1.0,
    ),
    ("inproc_w3_vs_w1", "in-process W3 drain / W1 drain (runq)", ">=", 0.9),
    # W5 (issue 30): POST /runs against the floor app on the same stack.
    *(
        (
            f"w5_{e}_post_c{c}_{m}_vs_floor",
            f"W5 {name} POST /runs at {c} connections: runq / floor {what}",
            op,
            thr,
        )
        for e, name in (("pg", "PostgreSQL"), ("sqlite", "SQLite"))
        for c in (16, 64)
        for m, what, op, thr in (
            ("rps", "throughput", ">=", 0.7),
            ("p99", "p99 (lower is better)", "<=", 2.0),
        )
    ),
    # W6 (issue 30): durable steps against DBOS Transact.
    ("w6_step_ms_vs_dbos", "W6 per-step overhead (PostgreSQL): runq / DBOS", "<=", 1.0),
    ("w6_w1_step_vs_dbos_w1", "W6 W1 with a step per run / DBOS queue W1", ">=", 2.0),
]


#: The workers ``--profile`` attaches py-spy to, each during its first W1 drain.
PROFILED = ["runq", "runq" + INPROC, "pgqueuer" + INPROC]


def say(msg: str) -> None:
    print(msg, flush=True)


# -- environment ----------------------------------------------------------------------------


def ensure_peers(reinstall: bool) -> dict[str, str]:
    if reinstall or not PEER_PY.exists():
        say(f"creating {PEER_VENV.relative_to(ROOT)} and installing {' '.join(PEER_PACKAGES)}")
        PEERS_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(PEER_VENV)], check=True)
        subprocess.run(
            [str(PEER_PY), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=False
        )
        subprocess.run([str(PEER_PY), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=True)
    out = subprocess.run(
        [
            str(PEER_PY),
            "-c",
            "import json, importlib.metadata as m; "
            "print(json.dumps({p: m.version(p) for p in "
            "['pgqueuer', 'procrastinate', 'asyncpg', 'psycopg', 'uvloop']}))",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    versions: dict[str, str] = json.loads(out.stdout)
    return versions


def ensure_dbos(reinstall: bool) -> dict[str, str]:
    """DBOS Transact for W6, in its own venv; its version."""
    if reinstall or not DBOS_PY.exists():
        say(f"creating {DBOS_VENV.relative_to(ROOT)} and installing {' '.join(DBOS_PACKAGES)}")
        PEERS_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(DBOS_VENV)], check=True)
        subprocess.run([str(DBOS_PY), "-m", "pip", "install", "-q", *DBOS_PACKAGES], check=True)
    out = subprocess.run(
        [
            str(DBOS_PY),
            "-c",
            "import json, importlib.metadata as m; "
            "print(json.dumps({'dbos': m.version('dbos'), 'dbos_sqlalchemy': "
            "m.version('sqlalchemy'), 'dbos_psycopg': m.version('psycopg')}))",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    versions: dict[str, str] = json.loads(out.stdout)
    return versions


def machine_info(dsn_versions: dict[str, str]) -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        commit = "unknown"
    import importlib.metadata as md

    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "memory_gb": mem_gb,
        "os": platform.platform(),
        "python": platform.python_version(),
        "runq": md.version("runq"),
        "runq_commit": commit,
        "runq_asyncpg": md.version("asyncpg"),
        **dsn_versions,
    }


async def pg_info(dsn: str) -> dict[str, str]:
    con = await asyncpg.connect(dsn)
    try:
        version = await con.fetchval("SHOW server_version")
        settings = {
            name: await con.fetchval("SELECT current_setting($1)", name)
            for name in ("shared_buffers", "synchronous_commit", "fsync", "max_connections")
        }
    finally:
        await con.close()
    return {"postgresql": version, "postgresql_settings": json.dumps(settings, sort_keys=True)}


def db_url(base: str, name: str) -> str:
    head, _, _ = base.rpartition("/")
    return f"{head}/{name}"


async def recreate_db(base: str, name: str, *, drop_only: bool = False) -> None:
    con = await asyncpg.connect(base)
    try:
        await con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not drop_only:
            await con.execute(f'CREATE DATABASE "{name}"')
    finally:
        await con.close()


# -- one measurement -----------------------------------------------------------------------


#: W6's sizes: W1 runs, steps per run and runs of the step overhead, recorded steps of
#: the replay, children of the fan-out.
W6_FULL = {"runs": 20000, "steps": 100, "step_runs": 20, "recorded": 1000, "children": 1000}


def sizes(quick: bool, smoke: bool = False) -> dict[str, dict[str, Any]]:
    if smoke:
        # Seconds per measurement: proves each harness runs, measures nothing.
        return {
            "W1": {"runs": 500},
            "W2": {"runs": 50},
            "W3": {"runs": 500, "final": 2000, "foreign": 2000},
            W3_BASE: {"runs": 500, "final": 0, "foreign": 0},
            "W4": {"runs": 500},
            "floor": {"runs": 500},
            "mem": {"runs": 2000},
            "W5": {"duration": 1, "warmup": 0.5, "ids": 200},
            "W6": {"runs": 500, "steps": 100, "step_runs": 3, "recorded": 100, "children": 20},
            "W1cold": {"runs": 1000},
            W1COLD_BASE: {"runs": 1000},
        }
    if quick:
        return {
            "W1": {"runs": 4000},
            "W2": {"runs": 400},
            "W3": {"runs": 2000, "final": 40000, "foreign": 40000},
            W3_BASE: {"runs": 2000, "final": 0, "foreign": 0},
            "W4": {"runs": 4000},
            "floor": {"runs": 4000},
            "mem": {"runs": 10000},
            "W5": {"duration": 3, "warmup": 1, "ids": 500},
            "W6": {**W6_FULL, "runs": 4000, "step_runs": 5},
            "W1cold": {"runs": 4000},
            W1COLD_BASE: {"runs": 4000},
        }
    return {
        "W1": {"runs": 20000},
        "W2": {"runs": 2000},
        "W3": {"runs": 5000, "final": 200000, "foreign": 200000},
        W3_BASE: {"runs": 5000, "final": 0, "foreign": 0},
        "W4": {"runs": 20000},
        "floor": {"runs": 20000},
        "mem": {"runs": 100000},
        "W5": {"duration": 10, "warmup": 2, "ids": 1000},
        "W6": dict(W6_FULL),
        "W1cold": {"runs": 20000},
        W1COLD_BASE: {"runs": 20000},
    }


def command(
    system: str,
    workload: str,
    dsn: str,
    size: dict[str, Any],
    args: argparse.Namespace,
    logdir: Path,
    profile: str | None,
) -> list[str]:
    if workload == "W5":
        return w5_command(system, dsn, size, logdir, profile)
    if workload == "W6":
        return w6_command(system, dsn, size, args, logdir)
    opts = ["--dsn", dsn, "--logdir", str(logdir), "--runs", str(size["runs"])]
    if workload in ("W1cold", W1COLD_BASE):
        opts = [*opts, "--workload", "W1cold" if workload == "W1cold" else "W1"]
        opts += ["--inproc"] if system.endswith(INPROC) else []
        return [sys.executable, str(BENCH / "runq_bench.py"), "run", *opts]
    if system in ("floor", "floor_fused"):
        mode = "fused" if system == "floor_fused" else "sequential"
        return [sys.executable, str(BENCH / "floor.py"), *opts, "--mode", mode]
    opts += ["--workload", "W3" if workload == W3_BASE else workload]
    for key in ("final", "foreign"):
        if key in size:
            opts += [f"--{key}", str(size[key])]
    if system.endswith(INPROC):
        opts += ["--inproc"]
    if profile:
        opts += ["--pyspy", profile]
    base = system.removesuffix(INPROC)
    if base == "runq":
        return [sys.executable, str(BENCH / "runq_bench.py"), "run", *opts]
    opts += ["--cap", str(args.cap)]
    return [str(PEER_PY), str(BENCH / "peers" / f"{base}_bench.py"), "run", *opts]


def w5_command(
    system: str, dsn: str, size: dict[str, Any], logdir: Path, profile: str | None
) -> list[str]:
    server, engine, auth = W5_SYSTEMS[system]
    cmd = [sys.executable, str(BENCH / "w5_bench.py"), "--system", server, "--engine", engine]
    cmd += ["--auth", auth, "--dsn", dsn, "--logdir", str(logdir)]
    cmd += ["--duration", str(size["duration"]), "--warmup", str(size["warmup"])]
    cmd += ["--ids", str(size["ids"])]
    return cmd + (["--pyspy", profile, "--pyspy-scenario", "post_c16"] if profile else [])


def w6_command(
    system: str, dsn: str, size: dict[str, Any], args: argparse.Namespace, logdir: Path
) -> list[str]:
    script, role, extra = W6_SYSTEMS[system]
    base = ["--dsn", dsn, "--logdir", str(logdir)]
    if script == "runq_bench":
        runs = ["--runs", str(size["runs"]), "--inproc"]
        return [sys.executable, str(BENCH / "runq_bench.py"), "run", *base, *runs, *extra]
    sized = {
        "w1": ["--runs", str(size["runs"]), "--cap", str(args.cap), "--poll", str(args.dbos_poll)],
        "steps": ["--steps", str(size["steps"]), "--runs", str(size["step_runs"])],
        "recovery": ["--recorded", str(size["recorded"])],
        "replay": ["--recorded", str(size["recorded"])],
        "fanout": ["--children", str(args.children or size["children"])],
    }[role]
    if script == "dbos":
        return [str(DBOS_PY), str(BENCH / "peers" / "dbos_bench.py"), role, *base, *sized]
    return [sys.executable, str(BENCH / "w6_runq.py"), role, *base, *extra, *sized]


async def measure(
    system: str,
    workload: str,
    rep: int,
    size: dict[str, Any],
    args: argparse.Namespace,
    logdir: Path,
    profile: str | None = None,
) -> dict[str, Any]:
    # The pid keeps two bench runs on one PostgreSQL (other checkouts) off each other's
    # databases: each drops its own with FORCE.
    name = f"bench{os.getpid()}_{system}_{workload}_{rep}".lower()
    dsn = db_url(args.dsn, name)
    await recreate_db(args.dsn, name)
    try:
        cmd = command(system, workload, dsn, size, args, logdir, profile)
        log_path = logdir / f"{name}.log"
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=str(ROOT)
        )
        result: dict[str, Any] | None = None
        assert proc.stdout is not None
        with log_path.open("w") as logf:
            async for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                logf.write(line + "\n")
                if line.startswith("RESULT "):
                    result = json.loads(line[7:])
                elif args.verbose or "done" in line or "prefill" in line:
                    print(f"      {line.strip()}", flush=True)
        code = await proc.wait()
        if code != 0 or result is None:
            tail = "\n".join(log_path.read_text().splitlines()[-25:])
            raise RuntimeError(f"{name} failed (exit {code}); log {log_path}:\n{tail}")
        return result
    finally:
        if not args.keep_dbs:
            try:
                await recreate_db(args.dsn, name, drop_only=True)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
                say(f"      (could not drop {name}: {e})")


async def wait_for_postgres(dsn: str, limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while True:
        try:
            con = await asyncpg.connect(dsn, timeout=5)
            await con.close()
            return
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)


async def measure_retrying(
    system: str,
    workload: str,
    rep: int,
    size: dict[str, Any],
    args: argparse.Namespace,
    logdir: Path,
    profile: str | None,
) -> dict[str, Any] | None:
    """One measurement, tried twice: a shared machine may restart PostgreSQL under us."""
    for attempt in (1, 2):
        try:
            return await measure(system, workload, rep, size, args, logdir, profile)
        except Exception as e:
            say(f"      !! attempt {attempt} failed: {str(e).splitlines()[0]}")
            await wait_for_postgres(args.dsn)
    return None


# -- summary --------------------------------------------------------------------------------


def median_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in rows[0]:
        values = [r[key] for r in rows if key in r]
        nums = [
            v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
        ]
        if values and all(v == values[0] for v in values):
            out[key] = values[0]  # a constant (runs, version): kept as it is
        elif nums and len(nums) == len(values):
            out[key] = round(statistics.median(nums), 3)
        elif key == "partial":
            out[key] = any(values)
        else:
            out[key] = values[0]
    return out


def ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
        return round(a / b, 3)
    return None


#: Every reported ratio: name → (numerator, denominator), each (workload, system, metric).
RATIOS: dict[str, tuple[tuple[str, str, str], tuple[str, str, str]]] = {
    "w1_drain_vs_pgqueuer": (("W1", "runq", "drain_rate"), ("W1", "pgqueuer", "drain_rate")),
    "w1_drain_vs_procrastinate": (
        ("W1", "runq", "drain_rate"),
        ("W1", "procrastinate", "drain_rate"),
    ),
    "w1_submit_vs_pgqueuer": (("W1", "runq", "submit_rate"), ("W1", "pgqueuer", "submit_rate")),
    "w1_submit_vs_procrastinate": (
        ("W1", "runq", "submit_rate"),
        ("W1", "procrastinate", "submit_rate"),
    ),
    "w2_p50_vs_pgqueuer": (("W2", "runq", "p50_ms"), ("W2", "pgqueuer", "p50_ms")),
    "w2_p99_vs_pgqueuer": (("W2", "runq", "p99_ms"), ("W2", "pgqueuer", "p99_ms")),
    "w2_p50_vs_procrastinate": (("W2", "runq", "p50_ms"), ("W2", "procrastinate", "p50_ms")),
    "w2_p99_vs_procrastinate": (("W2", "runq", "p99_ms"), ("W2", "procrastinate", "p99_ms")),
    "w3_drain_vs_pgqueuer": (("W3", "runq", "drain_rate"), ("W3", "pgqueuer", "drain_rate")),
    "w3_drain_vs_procrastinate": (
        ("W3", "runq", "drain_rate"),
        ("W3", "procrastinate", "drain_rate"),
    ),
    "w3_vs_w1": (("W3", "runq", "drain_rate"), (W3_BASE, "runq", "drain_rate")),
    "w3_vs_w1_pgqueuer": (("W3", "pgqueuer", "drain_rate"), (W3_BASE, "pgqueuer", "drain_rate")),
    "w3_vs_w1_procrastinate": (
        ("W3", "procrastinate", "drain_rate"),
        (W3_BASE, "procrastinate", "drain_rate"),
    ),
    "w4_sqlite_vs_pgqueuer_w1": (("W4", "runq", "drain_rate"), ("W1", "pgqueuer", "drain_rate")),
    "w1_vs_floor": (("W1", "runq", "drain_rate"), ("floor", "floor", "drain_rate")),
    "pgqueuer_w1_vs_floor": (("W1", "pgqueuer", "drain_rate"), ("floor", "floor", "drain_rate")),
    "floor_fused_vs_floor": (
        ("floor", "floor_fused", "drain_rate"),
        ("floor", "floor", "drain_rate"),
    ),
}


def _inproc_ratios() -> None:
    """The same ratios between in-process workers (``inproc_...``), plus CPU per run."""
    for name, ((wn, sn, kn), (wd, sd, kd)) in list(RATIOS.items()):
        if {sn, sd} <= set(PEERS):
            RATIOS["inproc_" + name] = ((wn, sn + INPROC, kn), (wd, sd + INPROC, kd))
    for peer in PEERS[1:]:
        for w in ("W1", "W3"):
            RATIOS[f"{w.lower()}_cpu_vs_{peer}"] = (
                (w, "runq", "cpu_per_run_ms"),
                (w, peer, "cpu_per_run_ms"),
            )
            RATIOS[f"inproc_{w.lower()}_cpu_vs_{peer}"] = (
                (w, "runq" + INPROC, "cpu_per_run_ms"),
                (w, peer + INPROC, "cpu_per_run_ms"),
            )
    for peer in PEERS:
        RATIOS[f"{peer}_w1_inproc_vs_subprocess"] = (
            ("W1", peer + INPROC, "drain_rate"),
            ("W1", peer, "drain_rate"),
        )


_inproc_ratios()


def _w5_ratios() -> None:
    """W5: runq / floor (throughput and p99) per engine, scenario and connection count,
    runq with ``auth = "key"`` / runq open, and the bare ASGI floor / the Litestar floor."""
    for e in ("pg", "sqlite"):
        for mode, c in W5_SCENARIOS:
            name = f"{mode}_c{c}"
            for m, key in (("rps", "rps"), ("p99", "p99_ms")):
                metric = f"{name}_{key}"
                RATIOS[f"w5_{e}_{name}_{m}_vs_floor"] = (
                    ("W5", f"runq_{e}", metric),
                    ("W5", f"floor_{e}", metric),
                )
                RATIOS[f"w5_{e}_{name}_{m}_asgi_vs_floor"] = (
                    ("W5", f"asgi_{e}", metric),
                    ("W5", f"floor_{e}", metric),
                )
            for m, key in (("rps", "rps"), ("p99", "p99_ms")):
                RATIOS[f"w5_pg_{name}_{m}_key_vs_open"] = (
                    ("W5", "runq_pg_key", f"{name}_{key}"),
                    ("W5", "runq_pg", f"{name}_{key}"),
                )


_w5_ratios()
RATIOS.update(
    {
        # W6
        "w6_events10_vs_w1": (
            ("W6", "runq_w1_events", "drain_rate"),
            ("W6", "runq_w1", "drain_rate"),
        ),
        "w6_step_ms_vs_dbos": (
            ("W6", "runq_steps_pg", "ms_per_step"),
            ("W6", "dbos_steps", "ms_per_step"),
        ),
        "w6_step_ms_sqlite_vs_dbos": (
            ("W6", "runq_steps_sqlite", "ms_per_step"),
            ("W6", "dbos_steps", "ms_per_step"),
        ),
        "w6_w1_step_vs_dbos_w1": (
            ("W6", "runq_w1_step", "drain_rate"),
            ("W6", "dbos_w1", "drain_rate"),
        ),
        "w6_w1_step_vs_dbos_w1_step": (
            ("W6", "runq_w1_step", "drain_rate"),
            ("W6", "dbos_w1_step", "drain_rate"),
        ),
        "w6_w1_vs_dbos_w1": (("W6", "runq_w1", "drain_rate"), ("W6", "dbos_w1", "drain_rate")),
        "w6_replay_vs_dbos": (
            ("W6", "runq_replay_pg", "replay_s"),
            ("W6", "dbos_recovery", "replay_s"),
        ),
        # W1cold: the drain on a pool that met an empty table, against the normal W1
        "w1cold_vs_w1": (("W1cold", "runq", "drain_rate"), (W1COLD_BASE, "runq", "drain_rate")),
        "inproc_w1cold_vs_w1": (
            ("W1cold", "runq" + INPROC, "drain_rate"),
            (W1COLD_BASE, "runq" + INPROC, "drain_rate"),
        ),
    }
)


def summarize(med: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    def g(w: str, s: str, k: str) -> Any:
        return med.get(w, {}).get(s, {}).get(k)

    r: dict[str, Any] = {name: ratio(g(*num), g(*den)) for name, (num, den) in RATIOS.items()}
    r["mem_growth"] = g("mem", "runq", "rss_growth")
    for system in ("runq", "runq" + INPROC):
        suffix = "_inproc" if system.endswith(INPROC) else ""
        r[f"w1cold_last_vs_first_tenth{suffix}"] = g("W1cold", system, "last_vs_first")
        r[f"w1_last_vs_first_tenth{suffix}"] = g(W1COLD_BASE, system, "last_vs_first")
    return r


def check(value: Any, op: str, threshold: float) -> str:
    if not isinstance(value, (int, float)):
        return "n/a"
    ok = value >= threshold if op == ">=" else value <= threshold
    return "PASS" if ok else "FAIL"


def fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def render(
    med: dict[str, dict[str, dict[str, Any]]], ratios: dict[str, Any], meta: dict[str, Any]
) -> str:
    lines = [
        f"runq bench — {meta['started']} — {meta['machine']['cores']} cores, "
        f"{meta['machine']['cpu']}, "
        f"PostgreSQL {meta['machine']['postgresql']}, {meta['repetitions']} repetition(s), "
        f"{'smoke' if meta.get('smoke') else 'quick' if meta['quick'] else 'full'} sizes; medians",
    ]
    drains: list[str] = []
    for w in ["W1", "W2", W3_BASE, "W3", "W4", "floor", "mem", W1COLD_BASE, "W1cold"]:
        for s in SYSTEMS[w]:
            m = med.get(w, {}).get(s)
            if not m:
                continue
            label = (
                label_of(s)
                + (" (SQLite)" if w == "W4" else "")
                + (" *" if m.get("partial") else "")
            )
            drains.append(
                f"| {w} | {label} | {fmt(m.get('runs'))} | {fmt(m.get('submit_rate'), 0)} | "
                f"{fmt(m.get('drain_rate'), 0)} | {fmt(m.get('cpu_per_run_ms'), 3)} | "
                f"{fmt(m.get('p50_ms'), 2)} | "
                f"{fmt(m.get('p95_ms'), 2)} | {fmt(m.get('p99_ms'), 2)} | "
                f"{fmt(m.get('max_ms'), 2)} | {fmt(m.get('worker_peak_rss_mb'))} |"
            )
    if drains:
        lines += [
            "",
            "| workload | system | runs | submit runs/s | drain runs/s | worker CPU ms/run "
            "| p50 ms | p95 ms | p99 ms | max ms | worker peak RSS MB |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            *drains,
        ]
    if any(m.get("partial") for w in med.values() for m in w.values()):
        lines.append("")
        lines.append(
            "\\* drained for the measurement cap only (too slow to drain the whole workload "
            "in the time the bench allows); the rate is over the runs it finished."
        )
    mem = med.get("mem", {}).get("runq")
    if mem:
        lines += [
            "",
            f"Memory: runq worker RSS {fmt(mem.get('rss_after_1000_mb'))} MB after 1,000 runs, "
            f"{fmt(mem.get('rss_end_mb'))} MB after {fmt(mem.get('runs'))} "
            f"(peak {fmt(mem.get('worker_peak_rss_mb'))} MB).",
        ]
    flights = [
        f"{w} {med[w]['runq']['max_in_flight']}"
        for w in ("W1", "W3", "W4", "mem")
        if "max_in_flight" in med.get(w, {}).get("runq", {})
    ]
    if flights:
        lines += [
            "",
            f"runq runs in flight at once (from started_at/completed_at; limit "
            f"{meta['concurrency']}): {', '.join(flights)}.",
        ]
    lines += head_to_head(med, ratios)
    lines += render_w1cold(med)
    lines += render_w5(med, ratios)
    lines += render_w6(med, ratios)
    checked = [
        f"| {desc} | {fmt(ratios[key], 2)} | {op} {thr} | {check(ratios[key], op, thr)} |"
        for key, desc, op, thr in TARGETS
        if ratios.get(key) is not None
    ]
    if checked:
        lines += ["", "| target | ratio | goal | result |", "| --- | ---: | ---: | --- |", *checked]
    extra = [k for k in ratios if k not in {t[0] for t in TARGETS} and ratios[k] is not None]
    lines += ["", "Other ratios: " + ", ".join(f"{k} {fmt(ratios[k], 2)}" for k in extra)]
    return "\n".join(lines)


#: The head-to-head table: (row, workload, metric, ratio key, goal, digits).
HEAD_TO_HEAD = [
    ("W1 drain, runs/s", "W1", "drain_rate", "w1_drain_vs_pgqueuer", ">= 3x", 0),
    ("W1 bulk submit, runs/s", "W1", "submit_rate", "w1_submit_vs_pgqueuer", ">= 1.5x", 0),
    ("worker CPU per run, ms", "W1", "cpu_per_run_ms", "w1_cpu_vs_pgqueuer", "<= 1x", 3),
    ("W2 start latency p50, ms", "W2", "p50_ms", "w2_p50_vs_pgqueuer", "<= 1x", 2),
    ("W2 start latency p99, ms", "W2", "p99_ms", "w2_p99_vs_pgqueuer", "<= 1x", 2),
    ("W3 drain, runs/s", "W3", "drain_rate", "w3_drain_vs_pgqueuer", "", 0),
]


def render_w1cold(med: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """W1cold next to the normal W1: overall, first and last tenth of the drain."""
    rows = []
    for w, label in ((W1COLD_BASE, "normal W1"), ("W1cold", "pool opened on an empty table")):
        for s in SYSTEMS[w]:
            m = med.get(w, {}).get(s)
            if m:
                rows.append(
                    f"| {label} | {label_of(s)} | {fmt(m.get('drain_rate'), 0)} | "
                    f"{fmt(m.get('first_tenth_rate'), 0)} | {fmt(m.get('last_tenth_rate'), 0)} | "
                    f"{fmt(m.get('last_vs_first'), 2)} |"
                )
    if not rows:
        return []
    return [
        "",
        "W1cold: drain rate (runs/s) overall and over the first and last tenth of the runs",
        "",
        "| | worker | overall | first tenth | last tenth | last ÷ first |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
        *rows,
    ]


def render_w5(med: dict[str, dict[str, dict[str, Any]]], ratios: dict[str, Any]) -> list[str]:
    """W5 per engine: throughput and latency of each system, runq ÷ floor."""
    w5 = med.get("W5", {})
    out: list[str] = []
    for e, engine in (("pg", "PostgreSQL"), ("sqlite", "SQLite")):
        systems = [s for s in W5_SYSTEMS if s.endswith(f"_{e}") or s.startswith(f"runq_{e}_")]
        systems = [s for s in systems if s in w5]
        if not systems:
            continue
        head = " | ".join(f"{s} req/s | {s} p50 ms | {s} p99 ms" for s in systems)
        out += [
            "",
            f"W5 HTTP submission, {engine} (wrk, medians; batch = 100 runs per request)",
            "",
            f"| scenario | {head} | runq ÷ floor req/s | runq ÷ floor p99 |",
            "| --- |" + " ---: |" * (3 * len(systems) + 2),
        ]
        for mode, c in W5_SCENARIOS:
            name = f"{mode}_c{c}"
            cells = []
            for s in systems:
                m = w5[s]
                cells += [
                    fmt(m.get(f"{name}_rps"), 0),
                    fmt(m.get(f"{name}_p50_ms"), 2),
                    fmt(m.get(f"{name}_p99_ms"), 2),
                ]
            rps = fmt(ratios.get(f"w5_{e}_{name}_rps_vs_floor"), 2)
            p99 = fmt(ratios.get(f"w5_{e}_{name}_p99_vs_floor"), 2)
            out.append(f"| {name} | {' | '.join(cells)} | {rps} | {p99} |")
        errors = {
            s: sum(v for k, v in w5[s].items() if k.endswith("_errors") and isinstance(v, int))
            for s in systems
        }
        if any(errors.values()):
            out += ["", f"!! non-2xx or socket errors during W5 ({engine}): {errors}"]
    return out


def render_w6(med: dict[str, dict[str, dict[str, Any]]], ratios: dict[str, Any]) -> list[str]:
    w6 = med.get("W6", {})
    if not w6:
        return []

    def cell(system: str, key: str, digits: int = 1) -> str:
        m = w6.get(system)
        if m is None:
            return "-"
        if "skipped" in m:
            return "skipped"
        return fmt(m.get(key), digits)

    rows = [
        (
            "W1 drain, no-op, runs/s",
            cell("runq_w1", "drain_rate", 0),
            cell("dbos_w1", "drain_rate", 0),
            "w6_w1_vs_dbos_w1",
        ),
        (
            "W1 drain, 10 events per run, runs/s",
            cell("runq_w1_events", "drain_rate", 0),
            "",
            "w6_events10_vs_w1",
        ),
        (
            "W1 drain, one step per run, runs/s",
            cell("runq_w1_step", "drain_rate", 0),
            cell("dbos_w1_step", "drain_rate", 0),
            "w6_w1_step_vs_dbos_w1_step",
        ),
        (
            "per-step overhead, PostgreSQL, ms",
            cell("runq_steps_pg", "ms_per_step", 3),
            cell("dbos_steps", "ms_per_step", 3),
            "w6_step_ms_vs_dbos",
        ),
        (
            "per-step overhead, SQLite, ms",
            cell("runq_steps_sqlite", "ms_per_step", 3),
            "",
            "w6_step_ms_sqlite_vs_dbos",
        ),
        (
            "replay of the recorded steps to the first new one, s",
            cell("runq_replay_pg", "replay_s", 3),
            cell("dbos_recovery", "replay_s", 3),
            "w6_replay_vs_dbos",
        ),
        (
            "restart after SIGKILL to the first new step, s",
            "",
            cell("dbos_recovery", "restart_s", 3),
            "",
        ),
        ("fan-out/fan-in: children/s", cell("runq_fanout_pg", "children_per_s", 0), "", ""),
        (
            "fan-out/fan-in: parent's wake delay, ms",
            cell("runq_fanout_pg", "wake_delay_ms", 1),
            "",
            "",
        ),
    ]
    out = [
        "",
        "W6 durable features (runq in-process or one runq serve; DBOS Transact in-process)",
        "",
        "| | runq | DBOS | ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    for label, a, b, key in rows:
        out.append(f"| {label} | {a} | {b} | {fmt(ratios.get(key), 2) if key else ''} |")
    out.append(
        f"\nW1 with a step per run ÷ DBOS's no-op W1: {fmt(ratios.get('w6_w1_step_vs_dbos_w1'), 2)}"
        " (goal >= 2)."
    )
    skipped = sorted({m["skipped"] for m in w6.values() if "skipped" in m})
    if skipped:
        out += ["", *(f"skipped: {reason}" for reason in skipped)]
    return out


def head_to_head(med: dict[str, dict[str, dict[str, Any]]], ratios: dict[str, Any]) -> list[str]:
    """runq against PgQueuer, both variants side by side (the issue's table)."""

    def g(w: str, s: str, k: str) -> Any:
        return med.get(w, {}).get(s, {}).get(k)

    out = [
        "",
        "| | runq in-process | PgQueuer in-process | ratio | runq subprocess "
        "| PgQueuer subprocess | ratio | goal (in-process) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    shown = False
    for row, w, k, key, goal, digits in HEAD_TO_HEAD:
        cells = [
            fmt(g(w, "runq" + INPROC, k), digits),
            fmt(g(w, "pgqueuer" + INPROC, k), digits),
            fmt(ratios.get("inproc_" + key), 2),
            fmt(g(w, "runq", k), digits),
            fmt(g(w, "pgqueuer", k), digits),
            fmt(ratios.get(key), 2),
        ]
        if all(c == "-" for c in cells):
            continue
        shown = True
        out.append(f"| {row} | {' | '.join(cells)} | {goal} |")
    w3 = [ratios.get("inproc_w3_vs_w1"), ratios.get("inproc_w3_vs_w1_pgqueuer")]
    w3s = [ratios.get("w3_vs_w1"), ratios.get("w3_vs_w1_pgqueuer")]
    if any(v is not None for v in w3 + w3s):
        out.append(
            f"| W3 drain ÷ W1 drain at W3's size | {fmt(w3[0], 2)} | {fmt(w3[1], 2)} | "
            f"| {fmt(w3s[0], 2)} | {fmt(w3s[1], 2)} | | >= 0.9 |"
        )
    return out if shown else []


# -- main -----------------------------------------------------------------------------------


async def main_async(args: argparse.Namespace) -> int:
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    t_start = time.monotonic()
    selected = [w.strip() for w in args.only.split(",")] if args.only else list(WORKLOADS)
    unknown = [w for w in selected if w not in WORKLOADS]
    if unknown:
        say(f"unknown workload(s) {unknown}; choose from {WORKLOADS}")
        return 2
    reps = args.reps or (1 if args.quick or args.smoke else 3)
    variants = VARIANTS if args.variant == "both" else [args.variant]
    size = sizes(args.quick, args.smoke)
    if args.w5_asgi:
        SYSTEMS["W5"] = list(W5_SYSTEMS)
    versions = ensure_peers(args.reinstall_peers)
    if "W6" in selected:
        versions.update(ensure_dbos(args.reinstall_peers))
    machine = machine_info({**versions, **(await pg_info(args.dsn))})
    logdir = RESULTS / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    machine["loadavg_at_start"] = [round(x, 2) for x in load]
    if load[0] > 0.5:
        say(
            f"warning: load average {load[0]:.2f} before the run; other work on this machine skews "
            "absolute numbers (the interleaved ratios less so)"
        )
    say(
        f"machine: {machine['cores']} cores, {machine['cpu']}; PostgreSQL {machine['postgresql']}; "
        f"runq {machine['runq']} ({machine['runq_commit']}), pgqueuer {versions['pgqueuer']}, "
        f"procrastinate {versions['procrastinate']}"
    )

    # Interleaved: every repetition runs each workload for each system in turn.
    plan: list[tuple[int, str, str]] = []
    if "W3" in selected:
        selected.insert(selected.index("W3"), W3_BASE)
    if "W1cold" in selected:
        selected.insert(selected.index("W1cold"), W1COLD_BASE)
    for rep in range(1, reps + 1):
        for w in selected:
            if w == "mem" and rep > 1:
                continue  # one long drain is the measurement
            for s in SYSTEMS[w]:
                if w in VARIANT_FREE or variant_of(s) in variants:
                    plan.append((rep, w, s))
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {}
    failures: list[str] = []
    profiled: list[Path] = []
    for i, (rep, w, s) in enumerate(plan, 1):
        profile = None
        spy_out = RESULTS / f"profile_{w.lower()}_{s}.txt"
        profiled_here = (w == "W1" and s in PROFILED) or (w == "W5" and s == "runq_pg")
        if args.profile and profiled_here and spy_out not in profiled:
            profile = str(spy_out)
            profiled.append(spy_out)
        say(f"[{i}/{len(plan)}] rep {rep} {w} {s} ({time.monotonic() - t_start:.0f}s elapsed)")
        res = await measure_retrying(s, w, rep, size[w], args, logdir, profile)
        if res is None:
            failures.append(f"rep {rep} {w} {s}")
            continue
        raw.setdefault(w, {}).setdefault(s, []).append(res)
        if "skipped" in res:
            say(f"      -> skipped: {res['skipped']}")
            continue
        brief = {
            k: res[k]
            for k in (
                "submit_rate",
                "drain_rate",
                "cpu_per_run_ms",
                "p50_ms",
                "p99_ms",
                "worker_peak_rss_mb",
                "rss_growth",
                "partial",
                "last_vs_first",
                "post_c16_rps",
                "post_c16_p99_ms",
                "ms_per_step",
                "replay_s",
                "restart_s",
                "children_per_s",
                "wake_delay_ms",
            )
            if k in res
        }
        say(f"      -> {brief}")
    med = {w: {s: median_of(rows) for s, rows in by.items()} for w, by in raw.items()}
    ratios = summarize(med)
    meta = {
        "started": started,
        "seconds": round(time.monotonic() - t_start, 1),
        "quick": args.quick,
        "repetitions": reps,
        "sizes": {w: size[w] for w in selected},
        "smoke": args.smoke,
        "concurrency": 16,
        "variants": variants,
        "peer_cap_seconds": args.cap,
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        "failed_measurements": failures,
        "machine": machine,
    }
    for raw_profile in profiled:
        if raw_profile.exists():
            kind = ["--buckets", "http"] if raw_profile.name.startswith("profile_w5_") else []
            top = subprocess.run(  # noqa: ASYNC221 - once, after every measurement
                [sys.executable, str(BENCH / "profile_top.py"), str(raw_profile), *kind],
                capture_output=True,
                text=True,
            ).stdout
            raw_profile.with_suffix(".top.txt").write_text(top)
    table = render(med, ratios, meta)
    say("")
    say(table)
    targets = {
        key: {
            "description": desc,
            "value": ratios.get(key),
            "goal": f"{op} {thr}",
            "result": check(ratios.get(key), op, thr),
        }
        for key, desc, op, thr in TARGETS
    }
    out = {"meta": meta, "medians": med, "ratios": ratios, "targets": targets, "runs": raw}
    RESULTS.mkdir(exist_ok=True)
    name = "quick" if args.quick else "latest"
    if (args.only or args.variant != "both") and not args.quick:
        name = "partial"
    if args.smoke:
        name = "smoke"
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(table + "\n")
    say(f"\nwrote {(RESULTS / f'{name}.json').relative_to(ROOT)} in {meta['seconds']:.0f}s")
    if args.json:
        print(json.dumps({"medians": med, "ratios": ratios, "targets": targets}, indent=2))
    return 0


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="smaller workloads, 1 repetition")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny workloads, 1 repetition, seconds each: checks the harnesses, measures nothing",
    )
    p.add_argument("--only", default="", help="comma-separated workloads: " + ",".join(WORKLOADS))
    p.add_argument(
        "--reps", "--repeat", type=int, default=0, help="repetitions (default 3, quick 1)"
    )
    p.add_argument(
        "--variant",
        choices=[*VARIANTS, "both"],
        default="both",
        help="subprocess workers (runq serve on uvloop), in-process workers on the standard "
        "asyncio loop, or both (default)",
    )
    p.add_argument(
        "--dsn", default=DEFAULT_DSN, help="an existing database to connect to for CREATE DATABASE"
    )
    p.add_argument(
        "--cap", type=float, default=60.0, help="seconds a peer drain is measured at most"
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the runq workers and PgQueuer's in-process one during their first W1 drain",
    )
    p.add_argument(
        "--w5-asgi",
        action="store_true",
        help="W5: also measure the floor as a bare ASGI callable (the framework's share)",
    )
    p.add_argument(
        "--children",
        type=int,
        default=0,
        help="W6: children of the fan-out (default 1,000; issue 27 asks for 10,000 too)",
    )
    p.add_argument(
        "--dbos-poll",
        type=float,
        default=0.01,
        help="W6: DBOS's queue polling_interval_sec (its default 1.0 caps 16 slots at 16/s)",
    )
    p.add_argument("--reinstall-peers", action="store_true")
    p.add_argument("--keep-dbs", action="store_true", help="do not drop the bench databases")
    p.add_argument("--json", action="store_true", help="also print the summary JSON")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args()
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
