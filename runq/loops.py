"""How every loop of runq waits: between passes, and after a pass or a write that failed.

One policy object per loop, ``Retry``, counts the consecutive failures, says how long to
wait (jittered exponential ``Backoff``, so an outage never turns into a retry storm and the
first retry after a blip still comes quickly), counts the failure in
``runq_store_errors_total`` and tells its ``LoopObserver``: a pass failed (and whether the
store was unavailable, the error a database outage raises), or passes succeed again. The
observer decides what an operator reads; ``LogEachFailure`` (the default) writes one
warning per failure. ``run_periodically`` is the loop itself for every periodic service
(River's ``baseservice`` and Oban's plugin loop are the models): a pass at once, then one
every interval, sooner after a failure.

Every backoff constant of the package is here (the intervals are configuration).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import anyio

from runq.errors import StoreUnavailable
from runq.log import get_logger
from runq.metrics import STORE_ERRORS

log = get_logger(__name__)

T = TypeVar("T")

#: What a database that is away raises: the store's own error, a socket's, a deadline's.
UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (StoreUnavailable, OSError, TimeoutError)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Jittered exponential delays: ``base · 2^(failures-1)``, at most ``cap``, times
    uniform(0.5, 1) so replicas do not retry in step."""

    base: float
    cap: float

    def ceiling(self, failures: int) -> float:
        return min(self.cap, self.base * 2.0 ** max(failures - 1, 0))

    def delay(self, failures: int) -> float:
        return self.ceiling(failures) * random.uniform(0.5, 1.0)


#: Maintenance services and the scheduler (capped by their interval).
SERVICE_BACKOFF = Backoff(base=0.5, cap=30.0)
#: Heartbeats: a lease needs a renewal within its grace (capped by the interval).
HEARTBEAT_BACKOFF = Backoff(base=0.2, cap=2.0)
#: Claim passes.
CLAIM_BACKOFF = Backoff(base=0.2, cap=10.0)
#: Outcome writes: the completer's batches and the executor's settle writes.
WRITE_BACKOFF = Backoff(base=0.1, cap=2.0)
#: A handler's event batches.
EVENTS_BACKOFF = Backoff(base=0.05, cap=2.0)
#: The LISTEN connection's reconnects (reset only by a connection that held).
LISTENER_BACKOFF = Backoff(base=0.1, cap=5.0)


class LoopObserver(Protocol):
    """What an operator hears of a loop's failures (issue: quiet outage logs)."""

    def failed(
        self, retry: Retry, error: BaseException, delay: float, fields: dict[str, object]
    ) -> None:
        """A pass failed; ``retry.unavailable`` says whether the store was away."""

    def recovered(self, retry: Retry) -> None:
        """A pass succeeded after ``retry.failures`` failed ones."""


class LogEachFailure:
    """One warning per failed pass, under the loop's event name, with the error and the
    delay before the next try (``retry_in``) when the loop logs it."""

    def failed(
        self, retry: Retry, error: BaseException, delay: float, fields: dict[str, object]
    ) -> None:
        if retry.event is None:
            return
        if retry.log_delay:
            fields = {**fields, "retry_in": round(delay, 2)}
        log.warning(retry.event, error=str(error) or type(error).__name__, **fields)

    def recovered(self, retry: Retry) -> None:
        return None


LOG_EACH_FAILURE = LogEachFailure()


class Retry:
    """The delay policy of one loop: how long after a failure, and who hears of it.

    ``metric``: the ``service`` label counted in ``runq_store_errors_total`` (None: the
    loop counts elsewhere); ``event``: the warning ``LogEachFailure`` writes (None: none);
    ``ceiling``: no delay is longer (a service's interval)."""

    def __init__(
        self,
        backoff: Backoff,
        *,
        metric: str | None,
        event: str | None,
        log_delay: bool = True,
        ceiling: float | None = None,
        observer: LoopObserver = LOG_EACH_FAILURE,
    ) -> None:
        self.backoff = backoff
        self.metric = metric
        self.event = event
        self.log_delay = log_delay
        self.ceiling = ceiling
        self.observer = observer
        #: Consecutive failures, and whether the last one was the store being away.
        self.failures = 0
        self.unavailable = False

    def failed(self, error: BaseException, **fields: object) -> float:
        """Count a failure; returns the seconds to wait before the next try."""
        self.failures += 1
        self.unavailable = isinstance(error, UNAVAILABLE_ERRORS)
        delay = self.backoff.delay(self.failures)
        if self.ceiling is not None:
            delay = min(delay, self.ceiling)
        if self.metric is not None:
            STORE_ERRORS.labels(service=self.metric).inc()
        self.observer.failed(self, error, delay, fields)
        return delay

    def succeeded(self) -> None:
        """A pass went through: the next failure starts from the shortest delay again."""
        if self.failures:
            self.observer.recovered(self)
        self.failures = 0
        self.unavailable = False


def service_retry(name: str, interval: float) -> Retry:
    """A periodic service's policy: ``<name>.pass_failed`` per failure, counted under
    ``service="<name>"``, and never a longer wait than its interval."""
    return Retry(SERVICE_BACKOFF, metric=name, event=f"{name}.pass_failed", ceiling=interval)


async def run_periodically(
    once: Callable[[], Awaitable[T]],
    *,
    retry: Retry,
    interval: float | Callable[[T], float],
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    on_result: Callable[[T], None] | None = None,
    stopped: Callable[[], bool] = lambda: False,
) -> None:
    """Call ``once()`` now and again after each wait, until cancelled or ``stopped()``.

    After a pass: ``interval`` seconds (or ``interval(result)``; 0 goes on at once).
    After a failure: ``retry``'s delay. ``sleep`` waits (a loop that can be woken early
    passes its own). Cancellation is never swallowed."""
    while not stopped():
        try:
            result = await once()
        except Exception as e:
            await sleep(retry.failed(e))
            continue
        retry.succeeded()
        if on_result is not None:
            on_result(result)
        wait = interval(result) if callable(interval) else interval
        if wait > 0:
            await sleep(wait)
