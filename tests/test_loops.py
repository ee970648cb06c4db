"""The one loop and backoff policy every service and retry loop uses (``runq.loops``)."""

from __future__ import annotations

import logging

import pytest

from runq.errors import StoreContention, StoreUnavailable
from runq.loops import Backoff, OutageLog, Retry, run_periodically

pytestmark = [pytest.mark.anyio]


class Heard:
    """A ``LoopObserver`` that records what a loop tells it."""

    def __init__(self) -> None:
        self.failures: list[tuple[bool, dict[str, object]]] = []
        self.recoveries: list[int] = []

    def failed(
        self, retry: Retry, error: BaseException, delay: float, fields: dict[str, object]
    ) -> None:
        self.failures.append((retry.unavailable, fields))

    def recovered(self, retry: Retry) -> None:
        self.recoveries.append(retry.failures)


def test_delays_double_from_the_base_up_to_the_cap_with_jitter() -> None:
    backoff = Backoff(base=0.5, cap=4.0)
    assert [backoff.ceiling(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    for failures in range(1, 7):
        assert backoff.ceiling(failures) / 2 <= backoff.delay(failures) <= backoff.ceiling(failures)


def test_a_retry_tells_its_observer_whether_the_store_was_away_and_when_it_is_back() -> None:
    heard = Heard()
    retry = Retry(Backoff(1.0, 8.0), metric=None, event=None, ceiling=1.5, observer=heard)
    assert retry.failed(StoreUnavailable("down"), batch=3) <= 1.0
    assert retry.failed(ValueError("a bug")) <= 1.5  # 2.0 at most, cut to the ceiling
    assert heard.failures == [(True, {"batch": 3}), (False, {})]
    retry.succeeded()
    retry.succeeded()  # no failures since: nothing to tell
    assert heard.recoveries == [2]
    assert retry.failures == 0


async def test_a_loop_waits_its_interval_after_a_pass_and_its_backoff_after_a_failure() -> None:
    waits: list[float] = []
    outcomes = iter([1.0, RuntimeError("away"), 0.0, 2.0])
    passes = 0

    async def once() -> float:
        nonlocal passes
        passes += 1
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    retry = Retry(Backoff(0.25, 0.25), metric=None, event=None)
    await run_periodically(
        once, retry=retry, interval=lambda s: s, sleep=sleep, stopped=lambda: passes == 4
    )
    # 1 s after the first pass, the backoff after the failure, none after a pass asking
    # for 0 (go on at once), 2 s after the last.
    assert waits[0] == 1.0
    assert 0.125 <= waits[1] <= 0.25
    assert waits[2:] == [2.0]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[tuple[str, dict[str, object]]]:
    return [
        (r.getMessage(), dict(getattr(r, "runq_fields", {})))
        for r in caplog.records
        if r.levelno >= logging.WARNING
    ]


def test_an_outage_is_two_warnings_however_many_loops_notice_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [100.0]
    outage = OutageLog(clock=lambda: now[0])
    loops = [
        Retry(Backoff(0.1, 1.0), metric=name, event=f"{name}.pass_failed", observer=outage)
        for name in ("reaper", "heartbeat", "claimer")
    ]
    caplog.set_level(logging.DEBUG, logger="runq.loops")
    for _ in range(20):  # every loop fails again and again while the database is away
        for retry in loops:
            retry.failed(StoreUnavailable("PostgreSQL at db is unavailable: refused"))
    now[0] = 112.5
    for retry in loops:
        retry.succeeded()
    assert _warnings(caplog) == [
        (
            "store.unreachable",
            {"source": "reaper", "error": "PostgreSQL at db is unavailable: refused"},
        ),
        ("store.reachable", {"source": "reaper", "outage_seconds": 12.5}),
    ]
    assert not outage.down


def test_a_failure_that_is_no_outage_is_a_warning_logged_with_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage = OutageLog()
    retry = Retry(Backoff(0.1, 1.0), metric=None, event="claim.failed", observer=outage)
    caplog.set_level(logging.INFO, logger="runq.loops")
    for _ in range(9):
        retry.failed(ValueError("a bug"))
    retry.failed(StoreContention("PostgreSQL aborted claim 5 times (deadlock)"))
    failures = [fields["failures"] for event, fields in _warnings(caplog)]
    assert failures == [1, 2, 4, 8]  # the 10th (a contention, no outage) is not a power of 2
    assert not outage.down  # a contention is the database answering


def test_a_one_off_failure_joins_the_outage_or_warns_on_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage = OutageLog()
    caplog.set_level(logging.INFO, logger="runq.loops")
    outage.trouble("exporter", "exporter.refresh_failed", ValueError("bad row"))
    outage.trouble("exporter", "exporter.refresh_failed", OSError("connection refused"))
    outage.trouble("exporter", "exporter.refresh_failed", OSError("connection refused"))
    outage.reachable("exporter")
    assert [event for event, _ in _warnings(caplog)] == [
        "exporter.refresh_failed",
        "store.unreachable",
        "store.reachable",
    ]
