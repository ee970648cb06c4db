"""Heartbeats: every lease of this worker renewed in one statement per interval.

The interval is ``lock_grace_seconds / 3``, so two heartbeats may fail before a peer's
reaper judges a lease stale. The loop runs on through the drain (a run still finishing
must not be reaped by a peer). Each pass also refreshes the worker's ``last_seen_at``.
A lease the store reports lost stops that execution (its writes would be fenced off),
unless the execution's completion is already handed in: a batched completion that committed
just before the heartbeat's statement looks like a lost lease, and its fenced write reports
a real loss anyway. A lease whose row another transaction held (``busy``: the heartbeat
never waits for a run row) is neither renewed nor lost; the next pass tells;
a cancel requested meanwhile stops it too, at once rather than at its next checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio

from runq.config import Config
from runq.log import get_logger
from runq.loops import HEARTBEAT_BACKOFF, Retry, run_periodically
from runq.store.base import Store
from runq.worker.execution import Interrupt
from runq.worker.inflight import InFlight

log = get_logger(__name__)


@dataclass(frozen=True)
class HeartbeatConfig:
    #: Seconds between passes: ``lock_grace_seconds / 3``.
    interval: float

    @classmethod
    def from_config(cls, config: Config) -> HeartbeatConfig:
        return cls(interval=config.queue.heartbeat_interval)


@dataclass(frozen=True)
class HeartbeatReport:
    renewed: int = 0
    lost: int = 0
    cancelled: int = 0


class Heartbeat:
    def __init__(
        self, store: Store, worker_id: str, inflight: InFlight, config: HeartbeatConfig
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.inflight = inflight
        self.config = config
        self._soon = anyio.Event()

    def renew_soon(self) -> None:
        """Run the next pass now (before a long call that cannot checkpoint)."""
        self._soon.set()

    async def run_once(self) -> HeartbeatReport:
        leases = self.inflight.leases()
        result = await self.store.heartbeat_many(self.worker_id, leases)
        lost = [le for le in result.lost if not self.inflight.settling(le.run_id, le.attempt)]
        for lease in lost:
            # The execution's settle writes the one warning (run.lease_lost).
            if self.inflight.interrupt(lease.run_id, Interrupt.LEASE_LOST, lease.attempt):
                log.info(
                    "lease.lost",
                    run_id=lease.run_id,
                    attempt=lease.attempt,
                    worker_id=self.worker_id,
                )
        cancelled = 0
        for run_id in result.cancel_requested:
            if self.inflight.interrupt(run_id, Interrupt.CANCELLED):
                cancelled += 1
                log.info("run.cancel_observed", run_id=run_id, worker_id=self.worker_id)
        return HeartbeatReport(renewed=len(result.renewed), lost=len(lost), cancelled=cancelled)

    async def run(self) -> None:
        # After a failure, sooner than the interval: a lease needs a renewal within the grace.
        retry = Retry(
            HEARTBEAT_BACKOFF,
            metric="heartbeat",
            event="heartbeat.failed",
            log_delay=False,
            ceiling=self.config.interval,
        )
        await run_periodically(
            self.run_once, retry=retry, interval=self.config.interval, sleep=self._wait
        )

    async def _wait(self, seconds: float) -> None:
        """Until the next pass is due, or sooner when ``renew_soon`` asks for it."""
        with anyio.move_on_after(seconds):
            await self._soon.wait()
        self._soon = anyio.Event()
