"""Prometheus text for ``GET /metrics``: process counters plus gauges read from the database.

The DB-derived gauges (runs by status, oldest queued age per deployment, expired leases,
live workers, fleet settings that diverge) come from one ``store.health`` pass and a few
grouped reads, cached for a few seconds so a scrape storm never becomes a query storm.
When the database does not answer, the last values are served and the error is counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import anyio
from prometheus_client import generate_latest

from runq.config import FLEET_SETTINGS, BudgetConfig, Config
from runq.limits.budget import BudgetGate
from runq.limits.waits import held_counts
from runq.log import get_logger
from runq.loops import OUTAGE_LOG
from runq.metrics import (
    EXPIRED_LEASES,
    FLEET_SETTINGS_DIVERGENT,
    HELD_RUNS,
    LIVE_WORKERS,
    OLDEST_QUEUED_AGE,
    OLDEST_TRANSACTION_AGE,
    PAUSE_AGE,
    PAUSE_ALERT_AGE,
    REGISTRY,
    RUNS,
    STORE_ERRORS,
)
from runq.model import QueueHealth, Status, WorkerInfo
from runq.ops.fleet import fleet_divergences
from runq.store.base import Store

log = get_logger(__name__)


#: DB-derived gauges are refreshed at most this often (tuning, not configuration).
CACHE_SECONDS = 5.0


@dataclass(frozen=True)
class ExporterConfig:
    #: A lease is stale this long after its last heartbeat.
    lock_grace_seconds: float
    #: A worker counts as live when seen within this many seconds.
    worker_max_age_seconds: float
    #: DB-derived gauges are refreshed at most this often.
    cache_seconds: float
    #: The caps whose holds ``runq_held_runs{reason="budget"}`` counts.
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    #: The pause age that counts as forgotten, exported for the alert rule to compare.
    pause_alert_age_seconds: float = float("inf")

    @classmethod
    def from_config(cls, config: Config) -> ExporterConfig:
        q = config.queue
        return cls(
            lock_grace_seconds=q.lock_grace_seconds,
            worker_max_age_seconds=q.live_worker_seconds,
            cache_seconds=CACHE_SECONDS,
            budget=config.budget,
            pause_alert_age_seconds=q.pause_alert_age_seconds,
        )


class Exporter:
    def __init__(self, store: Store, config: ExporterConfig) -> None:
        self.store = store
        self.config = config
        PAUSE_ALERT_AGE.set(config.pause_alert_age_seconds)
        self._refreshed_at = float("-inf")
        self._lock = anyio.Lock()
        self._deployments: set[str] = set()
        # Its own gate, without the refusal counter: reading who is blocked is not a refusal.
        self._budget = BudgetGate(config.budget, store)

    async def refresh(self) -> None:
        async with self._lock:
            if time.monotonic() - self._refreshed_at < self.config.cache_seconds:
                return
            try:
                health = await self.store.health(
                    lock_grace_seconds=self.config.lock_grace_seconds,
                    worker_max_age_seconds=self.config.worker_max_age_seconds,
                )
            except Exception as e:
                STORE_ERRORS.labels(service="exporter").inc()
                OUTAGE_LOG.trouble("exporter", "exporter.refresh_failed", e)
                return
            OUTAGE_LOG.reachable("exporter")
            self._apply(health)
            try:
                await self._refresh_limits()
            except Exception as e:
                STORE_ERRORS.labels(service="exporter").inc()
                OUTAGE_LOG.trouble("exporter", "exporter.limits_refresh_failed", e)
            self._refreshed_at = time.monotonic()

    async def _refresh_limits(self) -> None:
        """Held-back runs by reason and the age of each pause: a few grouped reads per
        refresh, never a per-claim cost."""
        store = self.store
        pauses = await store.list_pauses()
        state = await store.limits_state()
        workers = await store.list_workers(max_age_seconds=self.config.worker_max_age_seconds)
        _apply_fleet_settings(workers)
        served = {w.deployment_id for w in workers if w.deployment_id}
        blocked = await self._budget.blocked() if self._budget.enabled else None
        queued = await store.queued_by_component(blocked)
        counts = held_counts(queued, store.limits, state, pauses, served)
        for reason, n in counts.items():
            HELD_RUNS.labels(reason=reason).set(n)
        PAUSE_AGE.clear()
        for p in pauses:
            PAUSE_AGE.labels(kind=p.kind, target=p.target).set(max(state.now - p.created_at, 0))

    def _apply(self, health: QueueHealth) -> None:
        for status in Status:
            RUNS.labels(status=status.value).set(health.counts.get(status.value, 0))
        ages = health.oldest_queued_age_by_deployment
        for gone in self._deployments - set(ages):
            OLDEST_QUEUED_AGE.remove(gone)
        for deployment, age in ages.items():
            OLDEST_QUEUED_AGE.labels(deployment_id=deployment).set(age)
        self._deployments = set(ages)
        EXPIRED_LEASES.set(health.expired_leases)
        OLDEST_TRANSACTION_AGE.set(health.oldest_transaction_age_seconds or 0.0)
        LIVE_WORKERS.set(health.live_workers)

    async def render(self) -> bytes:
        await self.refresh()
        return bytes(generate_latest(REGISTRY))


def _apply_fleet_settings(live: list[WorkerInfo]) -> None:
    """``runq_fleet_settings_divergent{setting}``: 1 for each fleet-wide setting on which
    the live workers disagree, 0 for the others (every setting always has a series, so an
    alert can tell "agreed" from "not exported")."""
    divergent = {d.setting for d in fleet_divergences(live)}
    for name in FLEET_SETTINGS:
        FLEET_SETTINGS_DIVERGENT.labels(setting=name).set(1 if name in divergent else 0)
