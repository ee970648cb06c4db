"""Retention: deletes final runs older than ``retention_seconds``.

Paused runs are kept until decided unless ``paused_retention_seconds > 0``. Deletion goes
in batches so no statement holds locks for long. The daemon runs a pass at start and then
every ``retention_interval_seconds`` (hourly); ``runq purge`` calls ``run_once``.
"""

from __future__ import annotations

from dataclasses import dataclass

from runq.config import Config
from runq.log import get_logger
from runq.loops import run_periodically, service_retry
from runq.metrics import RETENTION_DELETED
from runq.model import PurgeReport
from runq.store.base import Store

log = get_logger(__name__)


@dataclass(frozen=True)
class RetentionConfig:
    #: Final runs older than this are deleted (``[queue] retention_seconds``).
    retention_seconds: float
    #: Paused runs not updated for this long are deleted; 0 keeps them until decided.
    paused_retention_seconds: float
    #: Seconds between passes in the daemon (``[queue] retention_interval_seconds``).
    interval: float
    #: Rows per DELETE statement.
    batch_size: int = 500

    @classmethod
    def from_config(cls, config: Config) -> RetentionConfig:
        q = config.queue
        return cls(
            retention_seconds=q.retention_seconds,
            paused_retention_seconds=q.paused_retention_seconds,
            interval=q.retention_interval_seconds,
        )


class Retention:
    def __init__(self, store: Store, config: RetentionConfig) -> None:
        self.store = store
        self.config = config

    async def run_once(self) -> PurgeReport:
        """Delete batch after batch until one comes back short (nothing older is left), each
        batch its own short statement so other writers get the lock in between; bounded so
        one pass over a huge backlog still ends and leaves the rest to the next pass."""
        max_batches = 1000
        limit = max(int(self.config.batch_size), 1)
        report = PurgeReport()
        while report.batches < max_batches:
            deleted = await self.store.purge_batch(
                retention_seconds=self.config.retention_seconds,
                paused_retention_seconds=self.config.paused_retention_seconds,
                limit=limit,
            )
            if deleted:
                report.deleted += deleted
                report.batches += 1
            if deleted < limit:
                break
        RETENTION_DELETED.inc(report.deleted)
        if report.deleted:
            log.info("retention.pass", deleted=report.deleted, batches=report.batches)
        return report

    async def run(self) -> None:
        interval = self.config.interval
        retry = service_retry("retention", interval)
        await run_periodically(self.run_once, retry=retry, interval=interval)
