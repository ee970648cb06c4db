"""``[queue]`` and ``[reaper]``: how runs are claimed, executed, retried and reaped."""

from __future__ import annotations

import msgspec

from runq.config.checks import require
from runq.config.defaults import LIVE_WORKER_HEARTBEATS, REAP_LIMIT

TRANSPORTS = ("sync", "local", "postgres")
#: The ceiling of ``[queue] max_timeout_seconds`` (a year): past it a deadline is no deadline.
MAX_TIMEOUT_LIMIT = 366 * 86400.0

#: ``[queue]`` keys every replica sharing a database must set alike (docs/operations.md,
#: "Fleet-wide settings"): each worker records its values, and a difference is reported.
FLEET_SETTINGS = (
    "lock_grace_seconds",
    "stop_timeout_seconds",
    "retention_seconds",
    "max_attempts",
    "timeout_seconds",
)


class QueueConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    max_attempts: int = 1
    retry_delay_seconds: float = 30.0
    timeout_seconds: float = 3600.0
    #: The longest per-run ``timeout_seconds`` a submission may ask for (one run's handler
    #: deadline, instead of ``timeout_seconds``); a longer one is refused with a reason.
    max_timeout_seconds: float = 86400.0
    lock_grace_seconds: float = 60.0
    stop_timeout_seconds: float | None = None
    poll_interval: float = 1.0
    max_concurrency: int = 32
    max_queue_depth: int = 1000
    #: Queued runs not yet due (delayed) have their own bound: they never count against
    #: ``max_queue_depth``, so runs delayed far into the future cannot fill the queue.
    max_delayed: int = 10000
    #: One user's queued runs (0 = unbounded): no user can fill the queue for everyone.
    max_queued_per_user: int = 0
    retention_seconds: float = 86400.0
    paused_retention_seconds: float = 0.0
    retention_interval_seconds: float = 3600.0
    deployment_id: str = ""
    serialize_sessions: bool = True
    #: Claim runs ahead of free slots while handlers finish faster than a claim takes (see
    #: runq/worker/claimer.py); false claims only for free slots.
    claim_ahead: bool = True
    worker: bool = True
    #: A fleet-wide pause older than this is reported as forgotten (the
    #: ``RunqPauseForgotten`` alert compares ``runq_pause_age_seconds`` with it).
    pause_alert_age_seconds: float = 14400.0

    @property
    def heartbeat_interval(self) -> float:
        return self.lock_grace_seconds / 3

    @property
    def live_worker_seconds(self) -> float:
        """A worker seen (heartbeat) within this many seconds counts as live."""
        return LIVE_WORKER_HEARTBEATS * self.heartbeat_interval

    @property
    def effective_stop_timeout(self) -> float:
        if self.stop_timeout_seconds is not None:
            return self.stop_timeout_seconds
        return min(30.0, self.lock_grace_seconds - 1)

    @property
    def deployment(self) -> str | None:
        return self.deployment_id or None

    def fleet_settings(self) -> dict[str, float]:
        """The ``FLEET_SETTINGS`` as this replica applies them (the stop timeout as derived
        when unset), recorded in the workers table for peers to compare."""
        applied = {
            "lock_grace_seconds": self.lock_grace_seconds,
            "stop_timeout_seconds": self.effective_stop_timeout,
            "retention_seconds": self.retention_seconds,
            "max_attempts": self.max_attempts,
            "timeout_seconds": self.timeout_seconds,
        }
        return {name: float(applied[name]) for name in FLEET_SETTINGS}


class ReaperConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    limit: int = REAP_LIMIT


def validate_queue(q: QueueConfig) -> None:
    require(q.max_attempts >= 1, "queue.max_attempts", f"{q.max_attempts} must be >= 1")
    require(q.retry_delay_seconds >= 0, "queue.retry_delay_seconds", "must be >= 0")
    require(q.timeout_seconds > 0, "queue.timeout_seconds", "must be > 0")
    require(q.pause_alert_age_seconds > 0, "queue.pause_alert_age_seconds", "must be > 0")
    require(
        0 < q.max_timeout_seconds <= MAX_TIMEOUT_LIMIT,
        "queue.max_timeout_seconds",
        f"{q.max_timeout_seconds} must be > 0 and at most {MAX_TIMEOUT_LIMIT:g} (a year)",
    )
    require(
        q.lock_grace_seconds >= 3,
        "queue.lock_grace_seconds",
        f"{q.lock_grace_seconds} must be >= 3",
    )
    if q.stop_timeout_seconds is not None:
        require(
            0 <= q.stop_timeout_seconds < q.lock_grace_seconds,
            "queue.stop_timeout_seconds",
            (
                f"{q.stop_timeout_seconds} must be >= 0 and "
                f"< queue.lock_grace_seconds ({q.lock_grace_seconds})"
            ),
        )
    require(q.poll_interval > 0, "queue.poll_interval", f"{q.poll_interval} must be > 0")
    require(
        1 <= q.max_concurrency <= 10_000, "queue.max_concurrency", "must be between 1 and 10000"
    )
    require(q.max_queue_depth >= 0, "queue.max_queue_depth", "must be >= 0 (0 = unbounded)")
    require(q.max_delayed >= 0, "queue.max_delayed", "must be >= 0 (0 = unbounded)")
    require(q.max_queued_per_user >= 0, "queue.max_queued_per_user", "must be >= 0 (0 = unbounded)")
    require(q.retention_seconds > 0, "queue.retention_seconds", "must be > 0")
    require(q.paused_retention_seconds >= 0, "queue.paused_retention_seconds", "must be >= 0")
    require(q.retention_interval_seconds > 0, "queue.retention_interval_seconds", "must be > 0")
    require(len(q.deployment_id) <= 200, "queue.deployment_id", "must be at most 200 characters")
