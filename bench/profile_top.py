"""Summarize a py-spy raw profile (collapsed stacks, ``--format raw``): the frames with the
most samples, inclusive and self, totals for a few groups of interest, and every sample
in exactly one bucket of per-run cost (the first rule that matches its stack), so the
buckets add up to 100 %.

    python bench/profile_top.py bench/results/profile_w1_runq_inproc.txt [--top 25]
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


def bucket_of(frames: list[str]) -> str:
    runq_frames = [f for f in frames if "runq/" in f]
    innermost_runq = runq_frames[-1] if runq_frames else ""
    for name, rx, where in BUCKETS:
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
    args = p.parse_args()
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
        buckets[bucket_of(frames)] += n

    def pct(n: int) -> str:
        return f"{100 * n / max(total, 1):5.1f}%"

    print(f"{total} samples (active CPU only; py-spy excludes idle waits)\n")
    print("groups (a sample counts in every group on its stack):")
    for g, n in groups.most_common():
        print(f"  {pct(n)}  {g}")
    print("\nbuckets (each sample in exactly one; see BUCKETS for the rules):")
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
