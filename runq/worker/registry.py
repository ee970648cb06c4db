"""The worker registry: who is executing runs, for ``runq status`` and the exporter.

A worker id is random (``w-`` and 16 hex digits), never a user or host name; the host
name, pid, deployment and the fleet-wide settings it runs with (``FLEET_SETTINGS``, which
every replica must set alike) are recorded beside it. The heartbeat loop refreshes
``last_seen_at``; a clean stop removes the row; ``prune`` deletes rows not seen for a day
(a worker that was killed never removes its own).
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass, field

from runq.config import WORKER_PRUNE_INTERVAL_SECONDS, WORKER_ROW_MAX_AGE_SECONDS, Config
from runq.log import get_logger
from runq.loops import OUTAGE_LOG
from runq.model import WorkerInfo
from runq.store.base import Store

log = get_logger(__name__)


def new_worker_id() -> str:
    return f"w-{secrets.token_hex(8)}"


@dataclass(frozen=True)
class WorkerRegistryConfig:
    #: Rows not seen for this long are deleted by ``prune_once``.
    max_age_seconds: float
    #: How often the daemon prunes.
    prune_interval_seconds: float
    #: This replica's deployment, recorded beside the worker id (``[queue] deployment_id``).
    deployment_id: str | None
    #: The fleet-wide settings this replica applies, recorded for its peers to compare.
    settings: dict[str, float] = field(default_factory=dict)
    #: A peer seen within this many seconds is live (its settings count at start).
    live_worker_seconds: float = 0.0

    @classmethod
    def from_config(cls, config: Config) -> WorkerRegistryConfig:
        return cls(
            max_age_seconds=WORKER_ROW_MAX_AGE_SECONDS,
            prune_interval_seconds=WORKER_PRUNE_INTERVAL_SECONDS,
            deployment_id=config.queue.deployment,
            settings=config.queue.fleet_settings(),
            live_worker_seconds=config.queue.live_worker_seconds,
        )


@dataclass(frozen=True)
class PruneReport:
    deleted: int


class WorkerRegistry:
    def __init__(
        self,
        store: Store,
        config: WorkerRegistryConfig,
        *,
        worker_id: str,
    ) -> None:
        self.store = store
        self.config = config
        self.info = WorkerInfo(
            id=worker_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            deployment_id=config.deployment_id,
            settings=dict(config.settings),
        )

    async def register(self) -> None:
        await self.store.register_worker(self.info)
        log.info("worker.registered", worker_id=self.info.id, hostname=self.info.hostname)
        await self._compare_with_peers()

    async def _compare_with_peers(self) -> None:
        """Warn when a live peer holds leases for longer than this replica's grace: this
        replica's reaper would judge that peer's healthy leases stale and take its runs.
        Only a warning (a rolling change of the value passes through this state), and
        never a reason not to start: a failed read is logged and ignored."""
        mine = self.info.settings.get("lock_grace_seconds")
        if mine is None:
            return
        try:
            workers = await self.store.list_workers(max_age_seconds=self.config.live_worker_seconds)
        except Exception as e:
            OUTAGE_LOG.trouble("workers", "worker.peer_settings_unread", e)
            return
        longer = {
            w.id: w.settings["lock_grace_seconds"]
            for w in workers
            if w.id != self.info.id and w.settings.get("lock_grace_seconds", mine) > mine
        }
        if longer:
            log.warning(
                "worker.lock_grace_shorter_than_peers",
                worker_id=self.info.id,
                lock_grace_seconds=mine,
                peers=longer,
                hint="this replica's reaper may reap live leases of these peers; "
                "set queue.lock_grace_seconds alike on every replica",
            )

    async def remove(self) -> None:
        await self.store.remove_worker(self.info.id)
        log.info("worker.removed", worker_id=self.info.id)

    async def prune_once(self) -> PruneReport:
        deleted = await self.store.prune_workers(max_age_seconds=self.config.max_age_seconds)
        if deleted:
            log.info("worker.pruned", deleted=deleted)
        return PruneReport(deleted=deleted)
