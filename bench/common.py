"""Helpers shared by every bench script. Standard library only: the runq scripts import it
from the project's .venv, the peer scripts from bench/.peers/venv.

A bench script prints progress on stderr and its result as one line ``RESULT {json}`` on
stdout; bench/run.py collects those lines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
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
    p.add_argument("role", choices=["run", "worker"])
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
    return p


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
    ms = lambda x: round(x * 1000, 2)  # noqa: E731
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
    worker: subprocess.Popen[Any] | None = None,
    label: str = "drain",
) -> dict[str, Any]:
    """Poll ``remaining()`` until it is 0. ``timeout`` (from the call) is a failure; ``cap``
    (from the first progress) ends the measurement early, which is reported as ``partial``
    (a peer too slow to drain the whole workload in the time the bench allows it).

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
