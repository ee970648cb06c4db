"""How every loop of runq waits: between passes, and after a pass or a write that failed.

One policy object per loop, ``Retry``, counts the consecutive failures, says how long to
wait (jittered exponential ``Backoff``, so an outage never turns into a retry storm and the
first retry after a blip still comes quickly), counts the failure in
``runq_store_errors_total`` and tells the process's ``LoopObserver``: a pass failed (and
whether the store was unavailable, the error a database outage raises), or passes succeed
again. The observer decides what an operator reads; the one installed here,
``OutageLog``, turns an outage into two warnings for the whole process (the database is
unreachable; it is back, after so long) however many loops notice it, and logs other
failures with backoff. ``run_periodically`` is the loop itself for every periodic service
(River's ``baseservice`` and Oban's plugin loop are the models): a pass at once, then one
every interval, sooner after a failure.

Every backoff constant of the package is here (the intervals are configuration).
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import anyio

from runq.errors import StoreContention, StoreUnavailable
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
#: A statement the database aborted for contention (a deadlock, a serialization failure),
#: tried again by the store at once: the other party usually commits within milliseconds.
CONTENTION_BACKOFF = Backoff(base=0.005, cap=0.5)


def is_outage(error: BaseException) -> bool:
    """True for what a database that is away raises; a contention abort is an answer."""
    return isinstance(error, UNAVAILABLE_ERRORS) and not isinstance(error, StoreContention)


class LoopObserver(Protocol):
    """What an operator hears of a loop's failures."""

    def failed(
        self, retry: Retry, error: BaseException, delay: float, fields: dict[str, object]
    ) -> None:
        """A pass failed; ``retry.unavailable`` says whether the store was away."""

    def recovered(self, retry: Retry) -> None:
        """A pass succeeded after ``retry.failures`` failed ones."""


def _error_text(error: BaseException) -> str:
    return str(error) or type(error).__name__


def _worth_a_warning(failures: int) -> bool:
    """The 1st, 2nd, 4th, 8th... consecutive failure: a stuck loop keeps saying so, ever
    more rarely."""
    return failures & (failures - 1) == 0


class OutageLog:
    """The process's ``LoopObserver``: an outage is two warnings, whoever notices it.

    The first loop (or the listener) that finds the database away writes
    ``store.unreachable``; the failures of every loop after it are counted
    (``runq_store_errors_total{service}``) and logged at debug; the first success after it
    writes ``store.reachable`` with the outage's length. A failure that is not an outage
    (the database answered with an error) is a warning under the loop's own event, logged
    with backoff (see ``_worth_a_warning``) with the count of consecutive failures.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        #: When the database was first found away (None: reachable, as far as we know).
        self._down_since: float | None = None

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def unreachable(self, source: str, error: BaseException) -> None:
        """``source`` found the database away."""
        if self._down_since is not None:
            log.debug("store.still_unreachable", source=source, error=_error_text(error))
            return
        self._down_since = self._clock()
        log.warning("store.unreachable", source=source, error=_error_text(error))

    def reachable(self, source: str) -> None:
        """``source`` reached the database."""
        if self._down_since is None:
            return
        seconds, self._down_since = self._clock() - self._down_since, None
        log.warning("store.reachable", source=source, outage_seconds=round(seconds, 1))

    def trouble(self, source: str, event: str, error: BaseException, **fields: object) -> None:
        """A one-off failure outside any loop (an exporter refresh, a give-back): part of
        the outage when the store is away, else a warning under ``event``."""
        if is_outage(error):
            self.unreachable(source, error)
            return
        log.warning(event, error=_error_text(error), **fields)

    def failed(
        self, retry: Retry, error: BaseException, delay: float, fields: dict[str, object]
    ) -> None:
        if retry.unavailable:
            self.unreachable(retry.source, error)
            return
        if retry.event is None:
            return
        if retry.log_delay:
            fields = {**fields, "retry_in": round(delay, 2)}
        level = log.warning if _worth_a_warning(retry.failures) else log.debug
        level(retry.event, error=_error_text(error), failures=retry.failures, **fields)

    def recovered(self, retry: Retry) -> None:
        self.reachable(retry.source)


#: The observer of every loop of this process (one outage, one pair of warnings).
OUTAGE_LOG = OutageLog()


class Retry:
    """The delay policy of one loop: how long after a failure, and who hears of it.

    ``metric``: the ``service`` label counted in ``runq_store_errors_total`` (None: the
    loop counts elsewhere); ``event``: the warning a failure that is no outage is logged
    under (None: none);
    ``ceiling``: no delay is longer (a service's interval)."""

    def __init__(
        self,
        backoff: Backoff,
        *,
        metric: str | None,
        event: str | None,
        log_delay: bool = True,
        ceiling: float | None = None,
        observer: LoopObserver = OUTAGE_LOG,
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
        self.unavailable = is_outage(error)
        delay = self.backoff.delay(self.failures)
        if self.ceiling is not None:
            delay = min(delay, self.ceiling)
        if self.metric is not None:
            STORE_ERRORS.labels(service=self.metric).inc()
        self.observer.failed(self, error, delay, fields)
        return delay

    @property
    def source(self) -> str:
        """What this loop is called in a log line."""
        return self.metric or self.event or "loop"

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
