"""Every Prometheus metric runq exports, on one registry per process.

Names follow Prometheus conventions: base units (seconds), ``_total`` for counters,
and bounded label values (statuses, component types, outcomes, reasons — never ids).
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)

#: Queue waits span milliseconds (a hot fleet) to hours (a stuck deployment).
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)

RUNS = Gauge("runq_runs", "Runs in the table by status.", ["status"], registry=REGISTRY)
OLDEST_QUEUED_AGE = Gauge(
    "runq_oldest_queued_age_seconds",
    "Age of the oldest claimable queued run (from available_at), by deployment id ('' = none).",
    ["deployment_id"],
    registry=REGISTRY,
)
QUEUE_WAIT = Histogram(
    "runq_queue_wait_seconds",
    "Claim time minus available_at.",
    ["component_type"],
    buckets=WAIT_BUCKETS,
    registry=REGISTRY,
)
RUN_DURATION = Histogram(
    "runq_run_duration_seconds",
    "Execution time of one attempt, by outcome.",
    ["component_type", "outcome"],
    buckets=DURATION_BUCKETS,
    registry=REGISTRY,
)
RUNS_FINISHED = Counter(
    "runq_runs_finished_total",
    "Executions ended, by outcome and termination reason.",
    ["outcome", "termination_reason"],
    registry=REGISTRY,
)
CLAIMS = Counter("runq_claims_total", "Runs claimed by this process.", registry=REGISTRY)
#: Every claim pass, including those that claimed nothing or failed: a test waits on it to
#: prove that passes happened and took nothing, and an operator sees the claimers alive.
CLAIM_PASSES = Counter(
    "runq_claim_passes_total", "Claim passes this process finished.", registry=REGISTRY
)
SUBMISSIONS = Counter(
    "runq_submissions_total", "Runs accepted by this process.", ["origin"], registry=REGISTRY
)
REAPER_REQUEUED = Counter(
    "runq_reaper_requeued_total", "Stale runs the reaper put back on the queue.", registry=REGISTRY
)
REAPER_DEAD_LETTERED = Counter(
    "runq_reaper_dead_lettered_total", "Stale runs the reaper failed for good.", registry=REGISTRY
)
RETENTION_DELETED = Counter(
    "runq_retention_deleted_total", "Runs purged by retention.", registry=REGISTRY
)
LEASES_LOST = Counter(
    "runq_leases_lost_total", "Executions stopped because their lease was lost.", registry=REGISTRY
)
FENCED_WRITES = Counter(
    "runq_fenced_writes_total",
    "Writes of a worker that no longer held the lease, discarded.",
    ["verb"],
    registry=REGISTRY,
)
BUDGET_REFUSALS = Counter(
    "runq_budget_refusals_total",
    "Users or configurations held back by a budget limit, by the cap reached.",
    ["reason"],
    registry=REGISTRY,
)
UNOPENABLE_RUNS = Counter(
    "runq_unopenable_runs_total",
    "Claimed runs whose sealed values this process's seal.keys could not open (given back).",
    registry=REGISTRY,
)
LIVE_WORKERS = Gauge("runq_live_workers", "Workers seen recently.", registry=REGISTRY)
FLEET_SETTINGS_DIVERGENT = Gauge(
    "runq_fleet_settings_divergent",
    "1 when live workers run with different values of this fleet-wide setting, else 0.",
    ["setting"],
    registry=REGISTRY,
)
OLDEST_TRANSACTION_AGE = Gauge(
    "runq_db_oldest_transaction_age_seconds",
    "PostgreSQL: how long the oldest other transaction holding back the vacuum horizon has"
    " been open (0 when none, and always on SQLite).",
    registry=REGISTRY,
)
EXPIRED_LEASES = Gauge(
    "runq_expired_leases", "Running runs whose lease is stale.", registry=REGISTRY
)
IN_FLIGHT = Gauge("runq_in_flight_runs", "Runs executing in this process.", registry=REGISTRY)
CONCURRENCY_LIMIT = Gauge(
    "runq_concurrency_limit", "max_concurrency of this process.", registry=REGISTRY
)
EVENT_LOOP_LAG = Gauge(
    "runq_event_loop_lag_seconds",
    "How late the event loop ran a timer, last sample.",
    registry=REGISTRY,
)
STORE_ERRORS = Counter(
    "runq_store_errors_total",
    "Database errors a service survived (and retried).",
    ["service"],
    registry=REGISTRY,
)
STORE_RETRIES = Counter(
    "runq_store_retries_total",
    "Statements the database aborted for contention (deadlock, serialization failure, "
    "lock timeout) and that were tried again: nothing was written by them.",
    ["verb", "reason"],
    registry=REGISTRY,
)
STORE_FAILOVERS = Counter(
    "runq_store_failovers_total",
    "Times this process found its PostgreSQL primary on another server (a failover).",
    registry=REGISTRY,
)
STORE_PRIMARY = Gauge(
    "runq_store_primary_info",
    "1 for the PostgreSQL primary this process writes to (server = host:port as it reports).",
    ["server"],
    registry=REGISTRY,
)
SCHEDULE_FIRED = Counter(
    "runq_schedule_fired_total",
    "Schedule slots this process fired (made a run for).",
    ["schedule"],
    registry=REGISTRY,
)
SCHEDULE_SKIPPED = Counter(
    "runq_schedule_skipped_total",
    "Schedule slots recorded without a run: the previous run was not final (overlap = skip).",
    ["schedule"],
    registry=REGISTRY,
)
SCHEDULE_MISSED = Counter(
    "runq_schedule_missed_total",
    "Schedule slots missed by more than their grace and dropped by the catch-up rule.",
    ["schedule"],
    registry=REGISTRY,
)
SCHEDULE_LAST_FIRE = Gauge(
    "runq_schedule_last_fire_timestamp_seconds",
    "The slot time of the schedule's latest recorded slot (any replica), epoch seconds.",
    ["schedule"],
    registry=REGISTRY,
)
SCHEDULE_NEXT_FIRE = Gauge(
    "runq_schedule_next_fire_timestamp_seconds",
    "When the schedule's next slot is due, epoch seconds (database clock).",
    ["schedule"],
    registry=REGISTRY,
)
HELD_RUNS = Gauge(
    "runq_held_runs",
    "Queued runs held back, by reason: delayed, paused, limit, rate, no_worker.",
    ["reason"],
    registry=REGISTRY,
)
PAUSE_ALERT_AGE = Gauge(
    "runq_pause_alert_age_seconds",
    "[queue] pause_alert_age_seconds: the pause age RunqPauseForgotten alerts on.",
    registry=REGISTRY,
)
PAUSE_AGE = Gauge(
    "runq_pause_age_seconds",
    "Age of each active fleet-wide pause, by kind (component, deployment) and target.",
    ["kind", "target"],
    registry=REGISTRY,
)
