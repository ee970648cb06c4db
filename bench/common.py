"""Helpers shared by every bench script. Standard library only: the runq scripts import it
from the project's .venv, the peer scripts from bench/.peers/venv.

A bench script prints progress on stderr and its result as one line ``RESULT {json}`` on
stdout; bench/run.py collects those lines.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import math
import os
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent

# The workload sizes the issue fixes; --quick in run.py passes smaller ones.
W1_RUNS = 20_000
W2_RUNS = 2_000
W2_RATE = 200.0
W3_RUNS = 5_000
W3_FINAL = 200_000
W3_FOREIGN = 200_000
MEM_RUNS = 100_000
MEM_EARLY = 1_000
CONCURRENCY = 16
SUBMIT_BATCH = 1_000
WARMUP_RUNS = 20


#: Committed transactions of this database so far (a fresh database per measurement, so the
#: difference over a drain is the transactions the worker needed; the bench's own count polls
#: add about ten a second). Run ``SELECT pg_stat_clear_snapshot()`` first in PG >= 15.
XACT_SQL = (
    "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
)


def peer_parser() -> argparse.ArgumentParser:
    """The command line every peer script takes: a driver (``run``) or its ``worker``."""
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["run", "worker", "produce"])
    p.add_argument("--dsn", required=True)
    p.add_argument("--workload", default="W1")
    p.add_argument("--runs", type=int, default=W1_RUNS)
    p.add_argument("--final", type=int, default=W3_FINAL)
    p.add_argument("--foreign", type=int, default=W3_FOREIGN)
    p.add_argument("--rate", type=float, default=W2_RATE)
    p.add_argument("--batch", type=int, default=SUBMIT_BATCH)
    p.add_argument("--concurrency", type=int, default=CONCURRENCY)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument(
        "--cap", type=float, default=None, help="end a drain measurement after this many seconds"
    )
    p.add_argument("--logdir", default="/tmp")
    p.add_argument("--latency-file", default="")
    p.add_argument("--expect", type=int, default=0)
    p.add_argument(
        "--inproc",
        action="store_true",
        help="host the worker in this process on the standard asyncio loop (no uvloop)",
    )
    p.add_argument("--pyspy", default=None, help="py-spy the worker into this file")
    return p


# -- the in-process variant ----------------------------------------------------------------


class HandlerProbe:
    """What the no-op handler of an in-process worker notes: when it was first called
    (wall clock and this process's CPU time) and how often. The drain of the in-process
    variant is timed from that first call, and its CPU per run counted from it."""

    def __init__(self) -> None:
        self.calls = 0
        self.first_wall: float | None = None
        self.first_cpu: float | None = None
        self.first_times: os.times_result | None = None

    def hit(self) -> None:
        if self.first_wall is None:
            self.first_wall = time.time()
            self.first_cpu = time.process_time()
            self.first_times = os.times()
        self.calls += 1

    def cpu_since_first_call(self, runs: int) -> dict[str, Any]:
        """This process's CPU from the first handler call until now, per run, in total and
        split in user and system time (the kernel's share: socket writes and reads, epoll)."""
        cpu_end, times_end = time.process_time(), os.times()
        if self.first_cpu is None or self.first_times is None:
            return {"worker_cpu_s": None, "cpu_per_run_ms": None}
        user = times_end.user - self.first_times.user
        system = times_end.system - self.first_times.system
        return {
            "worker_cpu_s": round(cpu_end - self.first_cpu, 3),
            "cpu_per_run_ms": cpu_per_run_ms(cpu_end - self.first_cpu, runs),
            "cpu_user_per_run_ms": cpu_per_run_ms(user, runs),
            "cpu_sys_per_run_ms": cpu_per_run_ms(system, runs),
        }


#: The probe of this process: bench_components and the peers' handlers call ``PROBE.hit()``.
PROBE = HandlerProbe()


class TaskAlive:
    """``drain_watch``'s liveness check (``poll()`` like a ``Popen``) for a worker task
    hosted in this process: a worker that died fails the drain instead of hanging it."""

    def __init__(self, task: asyncio.Future[Any]) -> None:
        self.task = task
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if not self.task.done():
            return None
        self.returncode = 1 if self.task.cancelled() or self.task.exception() else 0
        return self.returncode


async def run_producer(cmd: list[str], log_path: Path) -> dict[str, Any]:
    """Run a ``produce`` subprocess to its end (its output to ``log_path``); its RESULT."""
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    log_path.write_bytes(out)  # noqa: ASYNC240 - once, after the producer ended
    results = [ln for ln in out.decode(errors="replace").splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not results:
        log(tail(log_path))
        raise RuntimeError(f"the producer failed (exit {proc.returncode}); log {log_path}")
    result: dict[str, Any] = json.loads(results[-1][7:])
    return result


async def wait_until(
    condition: Callable[[], bool], *, seconds: float, alive: TaskAlive, label: str
) -> None:
    """Wait for ``condition()`` with a deadline; fails when the worker task ended."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline or alive.poll() is not None:
            raise TimeoutError(f"{label}: not done after {seconds}s or the worker ended")
        await asyncio.sleep(0.05)


def inproc_rate(done: int, first_call: float | None, last_commit: float | None) -> float | None:
    """Runs per second from the first handler call to the last completion committed."""
    if first_call is None or last_commit is None or last_commit <= first_call:
        return None
    return round(done / (last_commit - first_call), 1)


def cpu_per_run_ms(cpu_s: float | None, runs: int) -> float | None:
    """Worker CPU milliseconds per run (``cpu_s`` measured across the drain only)."""
    if cpu_s is None or runs <= 0:
        return None
    return round(cpu_s * 1000 / runs, 4)


class PySpy:
    """Optional profile: ``py-spy record --gil`` attached to ``pid`` (this process for an
    in-process worker). The py-spy binary of the project's .venv serves every venv.

    ``--gil`` keeps only samples of a thread holding the GIL, i.e. Python running: on a
    shared machine a thread that returned from epoll or wrote to PostgreSQL's socket (and
    woke it) often waits for a core with that frame on its stack, which sampling would
    count as work. Time in system calls is measured instead as the worker's system CPU
    (``os.times``)."""

    def __init__(self, out: str | None, pid: int, *, rate: int | None = None) -> None:
        # RUNQ_BENCH_PYSPY_RATE: more samples for a longer look (--rate of py-spy).
        rate = rate or int(os.environ.get("RUNQ_BENCH_PYSPY_RATE", "250"))
        self.proc: subprocess.Popen[Any] | None = None
        if not out:
            return
        spy = BENCH_DIR.parent / ".venv" / "bin" / "py-spy"
        fmt = (
            "raw"
            if out.endswith(".txt")
            else "speedscope"
            if out.endswith(".json")
            else "flamegraph"
        )
        self.proc = subprocess.Popen(
            [
                str(spy),
                "record",
                "--gil",
                "--pid",
                str(pid),
                "--rate",
                str(rate),
                "--format",
                fmt,
                "--output",
                out,
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)  # attached before the measured work starts

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def write_json_atomically(path: str | Path, value: Any) -> None:
    """Write a JSON file so a reader never sees it half-written (temp file, then rename)."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(target)


async def wait_for_json(
    path: Path, *, worker: subprocess.Popen[Any], log_path: Path, seconds: float, label: str
) -> Any:
    """The JSON a worker writes with ``write_json_atomically``, once it exists; fails with
    the worker's log when it dies or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while not path.exists():  # noqa: ASYNC240 - a stat a tenth of a second
        if time.monotonic() > deadline or worker.poll() is not None:
            log(tail(log_path))
            raise TimeoutError(f"{label}: results never arrived")
        await asyncio.sleep(0.1)
    return json.loads(path.read_text())  # noqa: ASYNC240


def log(msg: str) -> None:
    print(f"    {msg}", file=sys.stderr, flush=True)


def emit(result: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(result), flush=True)


# -- memory --------------------------------------------------------------------------------


def proc_status_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak resident set, kept by the kernel) of ``pid`` in kB."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


def proc_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds ``pid`` has used so far (from /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


class CpuFromFirstProgress:
    """A worker subprocess's CPU across its drain: sampled at the first poll that saw
    progress (``drain_watch(on_first_progress=...)``) and at the end, so its start-up
    (imports, migrations, connecting) is left out, as the in-process variant leaves it out."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.first: float | None = None

    def __call__(self, left: int) -> None:
        self.first = proc_cpu_seconds(self.pid)

    def per_run_ms(self, polled: dict[str, Any], end_cpu: float | None) -> float | None:
        if self.first is None or end_cpu is None:
            return None
        return cpu_per_run_ms(end_cpu - self.first, polled["runs_after_first_progress"])


class RssSampler:
    """Samples the resident set of one process on a thread; ``peak_mb`` also reads VmHWM."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_kb = 0
        self.last_kb = 0
        self.cpu_s: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def sample(self) -> int:
        st = proc_status_kb(self.pid)
        cpu = proc_cpu_seconds(self.pid)
        if cpu is not None:
            self.cpu_s = cpu
        rss = st.get("VmRSS", 0)
        if rss:
            self.last_kb = rss
        self.peak_kb = max(self.peak_kb, rss, st.get("VmHWM", 0))
        return rss

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self.sample()
        self._stop.set()
        self._thread.join(timeout=2)

    @property
    def peak_mb(self) -> float:
        return round(self.peak_kb / 1024, 1)


# -- statistics ----------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of an already sorted sequence."""
    if not sorted_values:
        return math.nan
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


def latency_summary(latencies_s: Sequence[float]) -> dict[str, float]:
    v = sorted(latencies_s)

    def ms(x: float) -> float:
        return round(x * 1000, 2)

    return {
        "n": len(v),
        "p50_ms": ms(percentile(v, 50)),
        "p95_ms": ms(percentile(v, 95)),
        "p99_ms": ms(percentile(v, 99)),
        "max_ms": ms(v[-1]) if v else math.nan,
    }


# -- timing helpers ------------------------------------------------------------------------


async def drain_watch(
    remaining: Callable[[], Awaitable[int]],
    total: int,
    *,
    timeout: float,  # noqa: ASYNC109 - a deadline for the whole drain
    cap: float | None = None,
    poll: float = 0.2,
    worker: subprocess.Popen[Any] | TaskAlive | None = None,
    label: str = "drain",
    on_first_progress: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Poll ``remaining()`` until it is 0. ``timeout`` (from the call) is a failure; ``cap``
    (from the first progress) ends the measurement early, which is reported as ``partial``
    (a peer too slow to drain the whole workload in the time the bench allows it).
    ``on_first_progress(left)`` is called at the first poll that saw progress (a worker
    subprocess's CPU is counted from there).

    Returns the polled window, from the first poll that saw progress to the last poll."""
    deadline = time.monotonic() + timeout
    t_first: float | None = None
    left_first = total
    last_report = time.monotonic()
    partial = False
    while True:
        left = await remaining()
        now = time.monotonic()
        if t_first is None and left < total:
            t_first, left_first = now, left
            if on_first_progress is not None:
                on_first_progress(left)
        if left == 0:
            break
        if t_first is not None and cap is not None and now - t_first > cap:
            partial = True
            break
        if now > deadline:
            raise TimeoutError(f"{label}: {left} of {total} runs still not final after {timeout}s")
        if worker is not None and worker.poll() is not None:
            raise RuntimeError(f"{label}: the worker exited with {worker.returncode}, {left} left")
        if now - last_report > 5:
            log(f"{label}: {total - left}/{total} done")
            last_report = now
        await asyncio.sleep(poll)
    assert t_first is not None
    span = max(now - t_first, 1e-6)
    return {
        "completed": total - left,
        "partial": partial,
        "polled_seconds": round(span, 3),
        "polled_rate": round((left_first - left) / span, 1),
        "runs_after_first_progress": left_first - left,
    }


def tenth_rates(stamps: Sequence[float]) -> dict[str, Any]:
    """Drain rate of each tenth of the runs in completion order (``stamps`` sorted): the
    tenth's runs over its time span, joined to the previous tenth's last completion so the
    spans add up to the whole window. ``last_vs_first`` < 1 means the drain slowed down."""
    n = len(stamps)
    if n < 20:
        return {}
    bounds = [round(i * (n - 1) / 10) for i in range(11)]
    rates = []
    for a, b in itertools.pairwise(bounds):
        span = stamps[b] - stamps[a]
        rates.append(round((b - a) / span, 1) if span > 0 else None)
    first, last = rates[0], rates[-1]
    return {
        "tenth_rates": rates,
        "first_tenth_rate": first,
        "last_tenth_rate": last,
        "last_vs_first": round(last / first, 3) if first and last else None,
    }


def window_rate(n: int, first: float | None, last: float | None) -> float | None:
    """Runs per second over the database's completion window (first to last completion)."""
    if first is None or last is None or last <= first or n < 2:
        return None
    return round((n - 1) / (last - first), 1)


async def paced(n: int, rate: float, submit_one: Callable[[int, float], Awaitable[None]]) -> float:
    """Open-loop producer: run ``i`` is due at ``start + i / rate``; a late submit does not
    shift the schedule. Returns the achieved submit rate."""
    start = time.monotonic()
    for i in range(n):
        due = start + i / rate
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        await submit_one(i, time.time())
    return n / (time.monotonic() - start)


def start_process(
    cmd: list[str], *, env: dict[str, str] | None = None, log_path: Path
) -> subprocess.Popen[Any]:
    f = open(log_path, "wb")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    f.close()
    return proc


def stop_process(proc: subprocess.Popen[Any], *, timeout: float = 15) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def env_with(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


# -- runq's configuration and environment --------------------------------------------------


def new_seal_key() -> str:
    """A seal key as ``runq keys generate`` prints it: url-safe base64 of 32 random bytes."""
    return base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")


def runq_env(seal_key: str) -> dict[str, str]:
    """The environment of a ``runq serve`` (or a process loading the same config): the seal
    key, ``bench/`` importable for ``bench_components``, no ``RUNQ_CONFIG`` of the caller."""
    env = env_with(
        RUNQ_SEAL_KEY=seal_key,
        PYTHONPATH=os.pathsep.join(filter(None, [str(BENCH_DIR), os.environ.get("PYTHONPATH")])),
    )
    env.pop("RUNQ_CONFIG", None)
    return env


def runq_config_text(
    url: str,
    *,
    queue: dict[str, Any],
    components: dict[str, str],
    http: dict[str, Any] | None = None,
    schema: str = "runq",
) -> str:
    """A bench run's runq.toml: the store, ``[queue]`` and ``[http]`` as given (HTTP off
    by default), sealing from ``RUNQ_SEAL_KEY`` on PostgreSQL (SQLite: the default key
    file), the transport that wakes claimers on that engine, and ``components``
    (``"type/id" = "module:function"``). Values are written as JSON, which TOML reads."""
    postgres = url.startswith("postgres")

    def table(name: str, values: dict[str, Any]) -> str:
        return "\n".join(
            [f"[{name}]", *(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in values.items())]
        )

    parts = [
        table("store", {"url": url, "schema": schema}),
        table("queue", queue),
        table("http", http or {"listen": ""}),
        *([table("seal", {"keys": ["env:RUNQ_SEAL_KEY"]})] if postgres else []),
        table("routing", {"*": "postgres" if postgres else "local"}),
        table("components", components),
    ]
    return "\n\n".join(parts) + "\n"


def step_summary(ms_per_step: Sequence[float]) -> dict[str, Any]:
    """W6's per-step overhead over several runs or workflows: median, min, max, steps/s."""
    ms = sorted(ms_per_step)
    median = statistics.median(ms)
    return {
        "ms_per_step": round(median, 4),
        "ms_per_step_min": round(ms[0], 4),
        "ms_per_step_max": round(ms[-1], 4),
        "steps_per_s": round(1000 / median, 1) if median > 0 else None,
    }
