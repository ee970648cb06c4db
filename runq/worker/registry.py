"""The worker registry: who is executing runs, for ``runq status`` and the exporter.

A worker id is random (``w-`` and 16 hex digits), never a user or host name; the host
name, pid and deployment are recorded beside it. The heartbeat loop refreshes
``last_seen_at``; a clean stop removes the row; ``prune`` deletes rows not seen for a day
(a worker that was killed never removes its own).
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass

from runq.config import WORKER_PRUNE_INTERVAL_SECONDS, WORKER_ROW_MAX_AGE_SECONDS, Config
from runq.log import get_logger
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

    @classmethod
    def from_config(cls, config: Config) -> WorkerRegistryConfig:
        return cls(
            max_age_seconds=WORKER_ROW_MAX_AGE_SECONDS,
            prune_interval_seconds=WORKER_PRUNE_INTERVAL_SECONDS,
            deployment_id=config.queue.deployment,
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
        )

    async def register(self) -> None:
        await self.store.register_worker(self.info)
        log.info("worker.registered", worker_id=self.info.id, hostname=self.info.hostname)

    async def remove(self) -> None:
        await self.store.remove_worker(self.info.id)
        log.info("worker.removed", worker_id=self.info.id)

    async def prune_once(self) -> PruneReport:
        deleted = await self.store.prune_workers(max_age_seconds=self.config.max_age_seconds)
        if deleted:
            log.info("worker.pruned", deleted=deleted)
        return PruneReport(deleted=deleted)
