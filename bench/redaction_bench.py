"""How long ``[privacy] level = "redacted"`` takes on adversarial answers, per KB.

Redaction runs on text that callers control; a pattern that backtracks turns one large
answer into minutes of CPU. This measures ``runq.privacy.redact_text`` (and
``redact_value`` on a nested value) on inputs built to make backtracking patterns
quadratic, at the given size, and prints microseconds per KB for each. A linear
implementation shows the same µs/KB at every size; a quadratic one grows with it.

    .venv/bin/python bench/redaction_bench.py            # 1 MiB inputs
    .venv/bin/python bench/redaction_bench.py --kib 16   # smaller, e.g. for old code
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable
from typing import Any

from runq.privacy import redact_text, redact_value

#: Units repeated to the requested size: each aims at one kind of pattern.
ADVERSARIAL_UNITS: dict[str, str] = {
    "a-": "a-",  # e-mail local part / token runs that never reach '@'
    "a=": "a=",  # key=value chains
    "a1": "a1",  # one long opaque run
    "x@": "x@",  # '@' everywhere, no domain
    "a.b@": "a.b@c",  # domains without a top-level label
    "digits": "1 ",  # card-number candidates that never reach 13 digits... or do
    "dash-digits": "1-2",
    "eyJ": "eyJa.",  # near-miss JWTs
    "base64": "QUJD+/",  # standard base64 alphabet
    "bearer": "Bearer ",
    "quote-kv": 'password:"',  # quoted values that never close
    "query": "?token=&",
}


def _time(fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this thread): on a shared machine the CPU time is the
    cost of redaction itself, the wall time what a caller waited."""
    wall, cpu = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - wall, time.thread_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kib", type=int, default=1024, help="input size in KiB (1024)")
    args = parser.parse_args()
    size = args.kib * 1024
    kib = size / 1024
    print(f"{'input':<14}{'bytes':>9}{'wall s':>9}{'cpu s':>8}{'cpu µs/KB':>11}")

    def row(name: str, fn: Callable[[], Any]) -> float:
        wall, cpu = _time(fn)
        print(f"{name:<14}{size:>9}{wall:>9.3f}{cpu:>8.3f}{cpu * 1e6 / kib:>11.0f}")
        return cpu

    worst = 0.0
    for name, unit in ADVERSARIAL_UNITS.items():
        text = (unit * (size // len(unit) + 1))[:size]
        worst = max(worst, row(name, functools.partial(redact_text, text)))
    words = ["alice@example.com", "a-", "4111 1111 1111 1111", "x" * 40, "eyJ.a"]
    items = [{"k": words[i % len(words)], "n": [i, {"password": "p"}]} for i in range(size // 64)]
    row("nested value", functools.partial(redact_value, {"items": items}))
    print(f"worst text input: {worst:.3f} CPU s for {kib:.0f} KiB")


if __name__ == "__main__":
    main()
