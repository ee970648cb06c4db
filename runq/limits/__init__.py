"""Fleet-wide flow control: concurrency limits, rate limits and pauses.

``[limits."pattern"]`` entries match components like ``[routing]`` does (the most specific
pattern wins, so every run belongs to at most one limit group). The store enforces them
inside its claim transaction; this package holds the engine-neutral part: which group a
component is in, how much room a group has left, and the records of pauses and waits.
"""

from __future__ import annotations

from runq.limits.rules import (
    MAX_PAUSE_REASON_CHARS,
    NO_CAP,
    PAUSE_KINDS,
    GroupRule,
    LimitRules,
    LimitState,
    like_pattern,
    pattern_specificity,
    pause_target_problem,
    rate_window,
    split_running,
)
from runq.model import Pause

__all__ = [
    "MAX_PAUSE_REASON_CHARS",
    "NO_CAP",
    "PAUSE_KINDS",
    "GroupRule",
    "LimitRules",
    "LimitState",
    "Pause",
    "like_pattern",
    "pattern_specificity",
    "pause_target_problem",
    "rate_window",
    "split_running",
]
