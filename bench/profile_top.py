"""Summarize a py-spy raw profile (collapsed stacks, ``--format raw``): the frames with the
most samples, inclusive and self, plus totals for a few groups of interest.

    python bench/profile_top.py bench/results/profile_w1_runq.txt [--top 25]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

GROUPS = {
    "asyncpg (protocol, codecs, pool)": re.compile(r"asyncpg/"),
    "anyio / asyncio machinery": re.compile(r"anyio/|asyncio/"),
    "runq store (postgres/, rows.py)": re.compile(r"runq/store/"),
    "runq executor": re.compile(r"runq/daemon/executor\.py"),
    "runq claimer": re.compile(r"runq/daemon/claimer\.py"),
    "runq completer": re.compile(r"runq/daemon/completer\.py"),
    "sealing (runq/seal.py, cryptography)": re.compile(r"runq/seal\.py|cryptography/"),
    "logging (runq/log.py, logging)": re.compile(r"runq/log\.py|logging/"),
    "metrics (prometheus_client)": re.compile(r"prometheus_client/"),
    "msgspec / json": re.compile(r"msgspec|json/"),
}


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
    pct = lambda n: f"{100 * n / max(total, 1):5.1f}%"  # noqa: E731
    print(f"{total} samples (active CPU only; py-spy excludes idle waits)\n")
    print("groups (a sample counts in every group on its stack):")
    for g, n in groups.most_common():
        print(f"  {pct(n)}  {g}")
    print(f"\nself time, top {args.top}:")
    for f, n in self_.most_common(args.top):
        print(f"  {pct(n)}  {f}")
    print(f"\ninclusive, top {args.top} (runq frames only):")
    shown = 0
    for f, n in inclusive.most_common():
        if "runq/" in f and shown < args.top:
            print(f"  {pct(n)}  {f}")
            shown += 1


if __name__ == "__main__":
    main()
