"""Jittered exponential backoff, shared by every loop that retries after a database error.

The claimers, the heartbeat, the executor's settle writes and the maintenance loops all
back off the same way, so an outage never turns into a retry storm and the first retry
after a blip still comes quickly.
"""

from __future__ import annotations

import random

BACKOFF_MIN = 0.5
BACKOFF_MAX = 30.0


def backoff_delay(failures: int, *, cap: float = BACKOFF_MAX, base: float = BACKOFF_MIN) -> float:
    """Jittered exponential backoff: ``base · 2^(failures-1)`` capped, times uniform(0.5, 1)."""
    ceiling = min(cap, base * 2.0 ** max(failures - 1, 0))
    return ceiling * random.uniform(0.5, 1.0)
