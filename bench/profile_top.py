"""Summarize a py-spy raw profile (collapsed stacks, ``--format raw``): the frames with the
most samples, inclusive and self, totals for a few groups of interest, and every sample
in exactly one bucket of per-run cost (the first rule that matches its stack), so the
buckets add up to 100 %.

    python bench/profile_top.py bench/results/profile_w1_runq_inproc.txt [--top 25]
    python bench/profile_top.py bench/results/profile_w5_runq_pg.txt --buckets http

``--buckets http`` sorts the samples of an HTTP server (W5: ``runq serve`` or the floor app
under wrk) into what stands between a request and its INSERT: logging, metrics, sealing,
sync guards run in worker threads, auth, body decoding and validation, wake-ups, the
database driver, building the run, runq's own API code, the framework, the HTTP protocol
and the event loop.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

GROUPS = {
    "asyncpg (protocol, codecs, pool)": re.compile(r"asyncpg/"),
    "anyio / asyncio machinery": re.compile(r"anyio/|asyncio/"),
    "runq store (postgres/, codec.py)": re.compile(r"runq/store/"),
    "runq executor": re.compile(r"runq/worker/executor\.py"),
    "runq claimer": re.compile(r"runq/worker/claimer\.py"),
    "runq completer": re.compile(r"runq/worker/completer\.py"),
    "sealing (runq/seal.py, cryptography)": re.compile(r"runq/seal\.py|cryptography/"),
    "logging (runq/log.py, logging)": re.compile(r"runq/log\.py|logging/"),
    "metrics (prometheus_client)": re.compile(r"prometheus_client/"),
    "msgspec / json": re.compile(r"msgspec|json/"),
}


#: Exclusive buckets, first match wins: (name, rule over the stack, outermost frame first).
#: The order matters: a log call made by the executor is logging, not executor code; the
#: anyio scopes ``_durable`` opens are the retry wrapper's, not generic task machinery.
def _any(rx: str) -> re.Pattern[str]:
    return re.compile(rx)


BUCKETS: list[tuple[str, re.Pattern[str], str]] = [
    # (name, pattern, where: "any" frame of the stack, "leaf" frame, or "runq" = the
    # innermost runq frame)
    ("logging (runq/log.py, logging)", _any(r"runq/log\.py|/logging/"), "any"),
    ("metrics (prometheus_client, label lookups)", _any(r"prometheus_client/"), "any"),
    (
        "Run objects and sealed payloads (row_to_run, seal, actor, Run)",
        _any(r"row_to_run|runq/seal\.py|cryptography/|decode_actor|runq/model\.py|msgspec"),
        "any",
    ),
    ("shielded retry wrapper (Executor._durable)", _any(r"^Executor\._durable "), "runq"),
    ("asyncpg (protocol, codecs, pool)", _any(r"asyncpg/"), "any"),
    (
        "anyio task / cancel-scope / event machinery",
        _any(r"anyio/"),
        "leaf",
    ),
    (
        "asyncio tasks, futures, events",
        _any(r"asyncio/(tasks|futures|locks|mixins|timeouts)\.py"),
        "leaf",
    ),
    (
        "asyncio event loop (selector, callbacks, timers)",
        _any(r"asyncio/|selectors\.py|Runner\.run"),
        "leaf",
    ),
    ("runq executor (own code)", _any(r"runq/(daemon|worker)/executor\.py"), "leaf"),
    ("runq claimer (own code)", _any(r"runq/(daemon|worker)/claimer\.py"), "leaf"),
    ("runq completer (own code)", _any(r"runq/(daemon|worker)/completer\.py"), "leaf"),
    ("runq store (own code)", _any(r"runq/store/"), "leaf"),
    ("runq, other", _any(r"runq/"), "leaf"),
    ("pgqueuer (own code)", _any(r"pgqueuer/"), "leaf"),
]


#: W5's buckets (``--buckets http``), first match wins, as BUCKETS.
HTTP_BUCKETS: list[tuple[str, re.Pattern[str], str]] = [
    ("logging (runq/log.py, logging)", _any(r"runq/log\.py|/logging/"), "any"),
    ("metrics (prometheus_client)", _any(r"prometheus_client/"), "any"),
    ("sealing (runq/seal.py, cryptography)", _any(r"runq/seal\.py|cryptography/"), "any"),
    (
        "sync guard/dependency in a worker thread (litestar sync_to_thread)",
        _any(r"sync_to_thread|_run_sync_asyncio|concurrent/futures/"),
        "any",
    ),
    ("auth (runq/api/auth.py, guards)", _any(r"runq/api/auth\.py|^authenticate "), "any"),
    (
        "wake-up (transports, NOTIFY)",
        _any(r"runq/transports/|Queue\._wake|Queue\._inline_wake|\.notify "),
        "any",
    ),
    (
        "database driver (asyncpg, aiosqlite, sqlite3, runq's pool)",
        _any(r"asyncpg/|aiosqlite/|sqlite3/|runq/store/(postgres|sqlite)/connection\.py"),
        "any",
    ),
    (
        "request decoding and validation (msgspec, litestar signature/kwargs)",
        _any(r"msgspec|litestar/_signature/|litestar/_kwargs/|runq/api/json_body\.py"),
        "any",
    ),
    (
        "building the run and its row (Queue.new_run, model, rows)",
        _any(r"runq/model\.py|runq/store/rows\.py|new_run_of |Queue\.new_run "),
        "any",
    ),
    ("runq store and queue (own code)", _any(r"runq/store/|runq/queue\.py"), "leaf"),
    ("runq API (edge middleware, routes; own code)", _any(r"runq/api/"), "leaf"),
    ("runq, other", _any(r"runq/"), "leaf"),
    ("floor app (own code)", _any(r"floor_app\.py"), "leaf"),
    ("litestar (routing, middleware, responses)", _any(r"litestar/"), "leaf"),
    ("HTTP protocol (uvicorn, h11)", _any(r"uvicorn/|h11/"), "leaf"),
    (
        "event loop and task machinery (asyncio, anyio, uvloop)",
        _any(r"asyncio/|anyio/|uvloop|selectors\.py|Runner\.run"),
        "leaf",
    ),
]


def bucket_of(frames: list[str], rules: list[tuple[str, re.Pattern[str], str]] = BUCKETS) -> str:
    runq_frames = [f for f in frames if "runq/" in f]
    innermost_runq = runq_frames[-1] if runq_frames else ""
    for name, rx, where in rules:
        if where == "any" and any(rx.search(f) for f in frames):
            return name
        if where == "leaf" and rx.search(frames[-1]):
            return name
        if where == "runq" and rx.search(innermost_runq):
            return name
    return "other (bench, interpreter, imports)"


def frame_name(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (path/to/file.py)"; keeps lines apart otherwise
    return re.sub(r":\d+\)$", ")", frame)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--buckets", choices=["worker", "http"], default="worker")
    args = p.parse_args()
    rules = HTTP_BUCKETS if args.buckets == "http" else BUCKETS
    inclusive: Counter[str] = Counter()
    self_: Counter[str] = Counter()
    groups: Counter[str] = Counter()
    buckets: Counter[str] = Counter()
    total = 0
    for line in Path(args.path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = [frame_name(f) for f in stack.split(";")]
        for f in set(frames):
            inclusive[f] += n
        self_[frames[-1]] += n
        for g, rx in GROUPS.items():
            if any(rx.search(f) for f in frames):
                groups[g] += n
        buckets[bucket_of(frames, rules)] += n

    def pct(n: int) -> str:
        return f"{100 * n / max(total, 1):5.1f}%"

    print(f"{total} samples (active CPU only; py-spy excludes idle waits)\n")
    print("groups (a sample counts in every group on its stack):")
    for g, n in groups.most_common():
        print(f"  {pct(n)}  {g}")
    rule_name = "HTTP_BUCKETS" if args.buckets == "http" else "BUCKETS"
    print(f"\nbuckets (each sample in exactly one; see {rule_name} for the rules):")
    for g, n in buckets.most_common():
        print(f"  {pct(n)}  {g}")
    print(f"\nself time, top {args.top}:")
    for f, n in self_.most_common(args.top):
        print(f"  {pct(n)}  {f}")
    print(f"\ninclusive, top {args.top} (runq or pgqueuer frames only):")
    shown = 0
    for f, n in inclusive.most_common():
        if ("runq/" in f or "pgqueuer/" in f) and shown < args.top:
            print(f"  {pct(n)}  {f}")
            shown += 1


if __name__ == "__main__":
    main()
