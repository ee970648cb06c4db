"""The reaper: settles running runs whose lease went stale.

Rules, in order, applied by ``store.reap_stale`` with each UPDATE rechecking staleness so
a lease renewed after the scan wins: a non-idempotent section → ``failed`` /
``not_retryable``; no saved request → ``failed`` / ``not_retryable``; attempts used up →
``failed`` / ``retries_exhausted`` with an error saying how to requeue; otherwise
``queued`` (available now) and the claimers are woken. ``runq reap`` calls ``run_once``.

After a pass that could not reach the database, reaping resumes one ``lock_grace_seconds``
after the database answers again: nobody could heartbeat during the outage, and live
workers must get the chance to renew before their leases are judged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from runq.config import Config
from runq.log import get_logger
from runq.loops import run_periodically, service_retry
from runq.metrics import REAPER_DEAD_LETTERED, REAPER_REQUEUED
from runq.model import ReapReport
from runq.store.base import Store

log = get_logger(__name__)


@dataclass(frozen=True)
class ReaperConfig:
    #: A lease is stale this long after its last heartbeat (``[queue] lock_grace_seconds``).
    lock_grace_seconds: float
    #: At most this many stale runs per pass (``[reaper] limit``).
    limit: int
    #: Seconds between passes in the daemon (``[queue] poll_interval``).
    interval: float
    #: What the events of a dead-lettered run keep (``[privacy] level``), as at any settle.
    privacy_level: str
    redacted_max_chars: int

    @classmethod
    def from_config(cls, config: Config, *, limit: int | None = None) -> ReaperConfig:
        """``limit`` overrides ``[reaper] limit`` (``runq reap --limit``)."""
        return cls(
            lock_grace_seconds=config.queue.lock_grace_seconds,
            limit=config.reaper.limit if limit is None else limit,
            interval=config.queue.poll_interval,
            privacy_level=config.privacy.level,
            redacted_max_chars=config.privacy.redacted_max_chars,
        )


class Reaper:
    def __init__(
        self,
        store: Store,
        config: ReaperConfig,
        *,
        on_requeued: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.on_requeued = on_requeued
        #: A pass could not reach the database (see ``run_once``).
        self._outage = False
        self._hold_until = 0.0

    async def run_once(self) -> ReapReport:
        """One bounded pass. After a pass that could not reach the database, the reaper
        waits until the database answers and then one more ``lock_grace_seconds`` before it
        reaps: during an outage no worker could heartbeat, so a lease that went stale then
        says nothing about its worker, and live workers get a grace to renew first."""
        if self._outage:
            await self.store.ping()  # raises while the database is still away
            self._outage = False
            self._hold_until = time.monotonic() + self.config.lock_grace_seconds
            log.info("reaper.resumes_after_grace", seconds=self.config.lock_grace_seconds)
        if time.monotonic() < self._hold_until:
            return ReapReport()
        try:
            report = await self.store.reap_stale(
                lock_grace_seconds=self.config.lock_grace_seconds, limit=self.config.limit
            )
        except Exception:
            self._outage = True
            raise
        REAPER_REQUEUED.inc(report.requeued)
        REAPER_DEAD_LETTERED.inc(report.dead_lettered)
        if report.requeued or report.dead_lettered:
            log.info(
                "reaper.pass",
                requeued=report.requeued,
                dead_lettered=report.dead_lettered,
                skipped=report.skipped,
                requeued_ids=report.requeued_ids,
                dead_lettered_ids=report.dead_lettered_ids,
            )
        for run_id in report.requeued_ids:
            # Work its handler did may be done again: the operator hears of each one.
            log.warning(
                "run.executing_again",
                run_id=run_id,
                reason="lease_expired",
                detail="its worker stopped renewing the lease; queued again, and what its "
                "handler did may be done a second time",
            )
        if report.requeued and self.on_requeued is not None:
            self.on_requeued()
        await self._trim_events(report.dead_lettered_ids)
        return report

    async def _trim_events(self, run_ids: list[str]) -> None:
        """Dead-lettered runs are settled: trim their events to the privacy level."""
        for run_id in run_ids:
            try:
                await self.store.trim_events(
                    run_id, self.config.privacy_level, self.config.redacted_max_chars
                )
            except Exception as e:  # the run stays settled; its events stay as they were
                log.warning("reaper.trim_events_failed", run_id=run_id, error=str(e))

    async def run(self) -> None:
        interval = self.config.interval
        retry = service_retry("reaper", interval)
        await run_periodically(self.run_once, retry=retry, interval=interval)
