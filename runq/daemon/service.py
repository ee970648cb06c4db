"""The loop every maintenance service shares: tick at once, then on an interval.

A pass that raises is logged and counted, and the next one comes sooner (jittered
exponential backoff, capped by the interval), so a database outage never kills a
service; cancellation is never swallowed.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from runq.log import get_logger
from runq.metrics import STORE_ERRORS

log = get_logger(__name__)

T = TypeVar("T")

BACKOFF_MIN = 0.5
BACKOFF_MAX = 30.0


def sole_exception(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception inside ``group`` (nested groups flattened), or None when several.

    A task group that hosts a background task wraps the exception of its own body in a
    group; context managers built on one re-raise that exception alone (outside the
    ``except`` block, so its ``__context__`` stays its own) and callers see ``NotFound``,
    not ``ExceptionGroup``.
    """
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup):
        if len(inner.exceptions) != 1:
            return None
        inner = inner.exceptions[0]
    return inner


def backoff_delay(failures: int, *, cap: float = BACKOFF_MAX, base: float = BACKOFF_MIN) -> float:
    """Jittered exponential backoff: ``base · 2^(failures-1)`` capped, times uniform(0.5, 1)."""
    ceiling = min(cap, base * 2.0 ** max(failures - 1, 0))
    return ceiling * random.uniform(0.5, 1.0)


async def run_periodically(
    name: str,
    once: Callable[[], Awaitable[T]],
    interval: float,
    *,
    on_result: Callable[[T], None] | None = None,
) -> None:
    """Call ``once()`` now and then every ``interval`` seconds until cancelled."""
    failures = 0
    while True:
        try:
            result = await once()
        except Exception as e:
            failures += 1
            STORE_ERRORS.labels(service=name).inc()
            delay = min(interval, backoff_delay(failures))
            log.warning(
                f"{name}.pass_failed", error=str(e) or type(e).__name__, retry_in=round(delay, 2)
            )
            await anyio.sleep(delay)
            continue
        failures = 0
        if on_result is not None:
            on_result(result)
        await anyio.sleep(interval)
