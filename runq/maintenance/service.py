"""The loop every maintenance service shares: tick at once, then on an interval.

A pass that raises is logged and counted, and the next one comes sooner (jittered
exponential backoff, capped by the interval), so a database outage never kills a
service; cancellation is never swallowed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from runq.backoff import backoff_delay
from runq.log import get_logger
from runq.metrics import STORE_ERRORS

log = get_logger(__name__)

T = TypeVar("T")


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
