"""The run, its statuses and the state machine's transition table, as data both engines use.

Times are epoch seconds (float) read from the database clock. A ``Run`` is the
decoded row: payload, answer and resume state are already opened (unsealed).
"""

from __future__ import annotations

import enum
import unicodedata
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec


class Status(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PAUSED = "paused"


FINAL_STATUSES: frozenset[Status] = frozenset({Status.COMPLETED, Status.FAILED, Status.CANCELLED})
#: Statuses that hold a session's line (a paused run blocks the runs behind it).
ACTIVE_STATUSES: frozenset[Status] = frozenset({Status.QUEUED, Status.RUNNING, Status.PAUSED})


class TerminationReason(enum.StrEnum):
    COMPLETED = "completed"
    BUDGET_EXHAUSTED = "budget_exhausted"
    CANCELLED = "cancelled"
    RETRIES_EXHAUSTED = "retries_exhausted"
    NOT_RETRYABLE = "not_retryable"


class ComponentType(enum.StrEnum):
    AGENT = "agent"
    TEAM = "team"
    WORKFLOW = "workflow"
    TASK = "task"


COMPONENT_TYPES: frozenset[str] = frozenset(t.value for t in ComponentType)


class Transition(msgspec.Struct, frozen=True):
    """One verb of the state machine: from which statuses it may start, where it may end,
    and whether it is a worker's write fenced on its lease (id, attempt, worker, running)."""

    sources: frozenset[Status]
    targets: frozenset[Status]
    fenced: bool = False


#: The state machine as data. Every engine builds its guards (``status IN`` sources), the
#: status it writes (the target) and its fences from these, so the two engines cannot
#: disagree on which transitions exist.
TRANSITIONS: Mapping[str, Transition] = {
    "claim": Transition(frozenset({Status.QUEUED}), frozenset({Status.RUNNING})),
    "heartbeat": Transition(frozenset({Status.RUNNING}), frozenset({Status.RUNNING}), fenced=True),
    "complete": Transition(frozenset({Status.RUNNING}), frozenset({Status.COMPLETED}), fenced=True),
    "fail": Transition(
        frozenset({Status.RUNNING}), frozenset({Status.QUEUED, Status.FAILED}), fenced=True
    ),
    "pause": Transition(frozenset({Status.RUNNING}), frozenset({Status.PAUSED}), fenced=True),
    "settle_cancelled": Transition(
        frozenset({Status.RUNNING}), frozenset({Status.CANCELLED}), fenced=True
    ),
    "set_non_idempotent": Transition(
        frozenset({Status.RUNNING}), frozenset({Status.RUNNING}), fenced=True
    ),
    "append_events": Transition(
        frozenset({Status.RUNNING}), frozenset({Status.RUNNING}), fenced=True
    ),
    "continue": Transition(frozenset({Status.PAUSED}), frozenset({Status.QUEUED})),
    "cancel": Transition(frozenset({Status.QUEUED, Status.PAUSED}), frozenset({Status.CANCELLED})),
    "request_cancel": Transition(frozenset({Status.RUNNING}), frozenset({Status.RUNNING})),
    "requeue": Transition(frozenset({Status.FAILED, Status.CANCELLED}), frozenset({Status.QUEUED})),
    "reap": Transition(frozenset({Status.RUNNING}), frozenset({Status.QUEUED, Status.FAILED})),
}


class Actor(msgspec.Struct, frozen=True, kw_only=True):
    """Who asked for a run, frozen at submission and restored in the worker."""

    user_id: str | None = None
    service_account: bool = False
    scopes: tuple[str, ...] = ()


#: Longest pause summary kept; a longer one is cut (it is one line for a person to read).
MAX_PAUSE_SUMMARY_CHARS = 500
#: Line and tab characters become spaces in a summary; other control and invisible
#: format characters (escape sequences, bidi overrides) are dropped.
_SUMMARY_SPACES = frozenset("\t\n\r\x0b\x0c\x85\u2028\u2029")


def clean_pause_summary(text: str | None) -> str | None:
    """A handler's pause summary as stored: control and format characters stripped,
    surrounding space trimmed, at most ``MAX_PAUSE_SUMMARY_CHARS``; None when empty."""
    if text is None:
        return None
    kept = "".join(
        " " if ch in _SUMMARY_SPACES else ch
        for ch in str(text)
        if ch in _SUMMARY_SPACES or unicodedata.category(ch)[0] != "C"
    )
    kept = kept.strip()[:MAX_PAUSE_SUMMARY_CHARS].strip()
    return kept or None


class Resume(msgspec.Struct, frozen=True, kw_only=True):
    """What a continued run receives in ``ctx.resume``."""

    state: Any = None
    decision: Any = None


class NewRun(msgspec.Struct, kw_only=True):
    """A submission, with every default already resolved by the caller (Queue)."""

    component_type: str
    component_id: str
    payload: Any = None
    session_id: str | None = None
    actor: Actor = Actor()
    configuration: str | None = None
    idempotency_key: str | None = None
    max_attempts: int = 1
    deployment_id: str | None = None
    priority: int = 0
    delay_seconds: float = 0.0
    origin: str = "python"
    #: False for an inline run that keeps its request in memory only; the reaper
    #: then dead-letters it instead of retrying: nothing is left to run again.
    save_request: bool = True
    #: Set by the caller for tests and imports; normally generated.
    id: str | None = None
    #: Unique runs: at most one run per (component, key) counts at a time, fleet-wide.
    unique: UniqueSpec | None = None
    #: Runs sharing a key count together against ``[limits] max_running_per_key``.
    concurrency_key: str | None = None
    #: This run's handler deadline in seconds, instead of ``[queue] timeout_seconds``.
    timeout_seconds: float | None = None


class Run(msgspec.Struct, kw_only=True):
    """One row of the run table, opened."""

    id: str
    component_type: str
    component_id: str
    status: Status
    attempt: int
    max_attempts: int
    priority: int
    session_id: str | None
    user_id: str | None
    actor: Actor
    configuration: str | None
    deployment_id: str | None
    idempotency_key: str | None
    origin: str
    created_at: float
    updated_at: float
    available_at: float
    started_at: float | None
    completed_at: float | None
    locked_by: str | None
    locked_at: float | None
    error: str | None
    termination_reason: TerminationReason | None
    pause_reason: str | None
    cancel_requested: bool
    non_idempotent: bool
    has_request: bool
    payload: Any = None
    answer: Any = None
    resume: Resume | None = None
    tokens: int = 0
    cost: float = 0.0
    concurrency_key: str | None = None
    #: The run's own handler deadline (None: ``[queue] timeout_seconds``).
    timeout_seconds: float | None = None
    #: What the approver of a paused run is asked to decide (``ctx.pause(summary=...)``).
    pause_summary: str | None = None

    @property
    def component(self) -> str:
        return f"{self.component_type}/{self.component_id}"

    @property
    def lease(self) -> Lease:
        return Lease(self.id, self.attempt)

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATUSES


class Lease(msgspec.Struct, frozen=True, array_like=True):
    """The fencing token of one execution: the run and its attempt (with the worker id)."""

    run_id: str
    attempt: int


class Completion(msgspec.Struct, frozen=True, kw_only=True):
    """One finished execution for ``complete_many``. ``answer`` is already privacy-filtered."""

    run_id: str
    attempt: int
    answer: Any = None
    keep_answer: bool = True
    termination_reason: TerminationReason = TerminationReason.COMPLETED
    #: Events the handler emitted that are not written yet: they are written in the same
    #: fenced transaction, numbered before the ``completed`` event (a fenced-off completion
    #: writes none of them).
    events: tuple[NewEvent, ...] = ()
    #: ``[privacy] level`` the run's stored events are cut to as it completes (None: keep
    #: them as written); ``redacted_max_chars`` caps each value at ``redacted``.
    trim_level: str | None = None
    redacted_max_chars: int = 0


class SubmitResult(msgspec.Struct, frozen=True):
    run: Run
    created: bool


class FenceResult(msgspec.Struct, frozen=True):
    """Which writes of a batch took effect and which were fenced off (lease lost)."""

    applied: tuple[str, ...] = ()
    fenced_off: tuple[str, ...] = ()


class HeartbeatResult(msgspec.Struct, frozen=True):
    renewed: tuple[Lease, ...] = ()
    lost: tuple[Lease, ...] = ()
    #: Runs among the renewed ones whose cancel was requested meanwhile.
    cancel_requested: tuple[str, ...] = ()
    #: Leases neither renewed nor lost: another transaction held the run's row (this
    #: worker's own settle of it, the reaper, an operator's cancel) and the heartbeat does
    #: not wait for a row. The next heartbeat tells.
    busy: tuple[Lease, ...] = ()


class FailOutcome(enum.StrEnum):
    RETRY_SCHEDULED = "retry_scheduled"
    DEAD_LETTERED = "dead_lettered"
    FENCED_OFF = "fenced_off"


class ReapReport(msgspec.Struct, kw_only=True):
    requeued: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    requeued_ids: list[str] = msgspec.field(default_factory=list)
    dead_lettered_ids: list[str] = msgspec.field(default_factory=list)


class PurgeReport(msgspec.Struct, kw_only=True):
    deleted: int = 0
    batches: int = 0


class ClaimedRuns(list[Run]):
    """The runs a claim took, in claim order; a plain list of ``Run`` to most callers.

    ``unopenable`` names runs the claim took whose sealed values did not open with this
    process's keys (a replica started with the wrong ``seal.keys``). Those were given back
    at once: ``queued`` again, the attempt not spent, the reason in ``error``. A caller that
    keeps seeing them should stop claiming and report itself unready.
    """

    unopenable: tuple[str, ...]

    def __init__(self, runs: Iterable[Run] = (), unopenable: Iterable[str] = ()) -> None:
        super().__init__(runs)
        self.unopenable = tuple(unopenable)


class BudgetBlock(msgspec.Struct, frozen=True, kw_only=True):
    """Who may not be claimed for now because a budget limit is reached.

    ``pairs`` holds ``(user_id, configuration)`` for limits of scope ``both``;
    ``None`` members are matched as the empty string.
    """

    users: frozenset[str] = frozenset()
    configurations: frozenset[str] = frozenset()
    pairs: frozenset[tuple[str, str]] = frozenset()

    @property
    def empty(self) -> bool:
        return not (self.users or self.configurations or self.pairs)


class UsageKey(msgspec.Struct, frozen=True, array_like=True):
    """One budget counter: (scope, subject, period start as epoch seconds)."""

    scope: str
    subject: str
    period_start: float


class UsageTotals(msgspec.Struct, frozen=True, kw_only=True):
    cost: float = 0.0
    tokens: int = 0
    runs: int = 0


class Stats(msgspec.Struct, kw_only=True):
    """``GET /queue/stats``: counts by status and the oldest queued age (from ``available_at``)."""

    counts: dict[str, int]
    oldest_queued_age_seconds: float | None
    #: Active fleet-wide pauses, oldest first.
    pauses: list[Pause] = []
    #: Fleet-wide settings on which live workers disagree (docs/operations.md).
    fleet_divergences: list[SettingDivergence] = []


class Pause(msgspec.Struct, frozen=True, kw_only=True):
    """A fleet-wide pause of a component pattern or of a deployment."""

    id: str
    kind: str  # "component" | "deployment"
    target: str
    reason: str | None
    created_by: str | None
    created_at: float


class WaitReason(msgspec.Struct, frozen=True, kw_only=True):
    """Why a queued run is not running yet: ``kind`` is delayed, paused, limit, rate,
    budget, session or no_worker; ``message`` says it in words; ``until`` is when the
    hold ends, when that is known."""

    kind: str
    message: str
    pattern: str | None = None
    until: float | None = None


class QueuedCount(msgspec.Struct, frozen=True, array_like=True):
    """Queued runs of one (component, deployment): ready now, delayed, and, of the ready
    ones, those the budget holds back (``Store.queued_by_component``)."""

    component: str
    deployment_id: str
    ready: int
    delayed: int
    budget_held: int = 0


def wait_time(epoch: float) -> str:
    """A time as wait reasons give it: UTC, to the second, ``2026-11-30T18:00:00Z``."""
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class QueueHealth(msgspec.Struct, kw_only=True):
    """What ``runq status`` and the exporter read in one query pass."""

    counts: dict[str, int]
    oldest_queued_age_seconds: float | None
    oldest_queued_age_by_deployment: dict[str, float]
    expired_leases: int
    live_workers: int
    #: PostgreSQL only (None on SQLite, or when no other transaction is open): how long
    #: the oldest transaction holding back the vacuum horizon has been open, and its
    #: backend's pid. While it stays open no dead row version can be removed.
    oldest_transaction_age_seconds: float | None = None
    oldest_transaction_pid: int | None = None


class WorkerInfo(msgspec.Struct, kw_only=True):
    id: str
    hostname: str
    pid: int
    deployment_id: str | None
    started_at: float = 0.0
    last_seen_at: float = 0.0
    #: The fleet-wide settings this worker runs with (``QueueConfig.fleet_settings``); empty
    #: for a row written by a runq that did not record them.
    settings: dict[str, float] = {}


class SettingValue(msgspec.Struct, frozen=True, kw_only=True):
    """One value of a diverging setting and the live workers that run with it."""

    value: float
    workers: list[str]


class SettingDivergence(msgspec.Struct, frozen=True, kw_only=True):
    """A fleet-wide setting that live workers do not agree on."""

    setting: str
    values: list[SettingValue]

    def describe(self) -> str:
        shown = ", ".join(f"{v.value:g} on {', '.join(v.workers)}" for v in self.values)
        return f"{self.setting} differs across live workers: {shown}"


def retry_delay(attempt: int, base_seconds: float, rand: float) -> float:
    """Full-jitter backoff: uniform(0, min(base · 2^(attempt-1), 10 · base)). ``rand`` in [0, 1)."""
    ceiling = min(base_seconds * 2.0 ** max(attempt - 1, 0), 10 * base_seconds)
    return rand * ceiling


# -- schedules and unique runs ---------------------------------------------------------------


class UniqueSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A submission's uniqueness: an existing run with the same component and ``key`` is
    returned instead of a new one when its status is in ``states`` and it is not final or
    was created within the last ``for_seconds``."""

    key: str
    for_seconds: float
    states: frozenset[Status] = frozenset(Status)

    def holds(self, status: Status, created_at: float, now: float) -> bool:
        """True when an existing run in ``status`` created at ``created_at`` still counts."""
        if status not in self.states:
            return False
        return status not in FINAL_STATUSES or created_at > now - self.for_seconds


class ScheduleState(msgspec.Struct, frozen=True, kw_only=True):
    """What the fleet agrees on about one schedule (its database row)."""

    name: str
    paused: bool
    paused_at: float | None
    #: Slots at or before this were handled (fired, skipped or dropped by the catch-up rule).
    cursor_at: float
    last_slot_at: float | None
    last_fire_at: float | None
    last_run_id: str | None


class SlotFire(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of one attempt to fire a slot."""

    #: This call recorded the slot (False: another replica had, or the schedule is unknown).
    recorded: bool
    #: The run made for the slot by this call (None when not recorded or skipped by overlap).
    run_id: str | None


# -- the per-run event log ----------------------------------------------------------------

#: The events that end a run's stream.
FINAL_EVENT_KINDS = frozenset({"completed", "failed", "cancelled"})


class RunEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a run's event log: ``seq`` counts from 1 without gaps; ``at`` is the
    database clock; ``data`` is what the handler emitted (or runq's own details of a
    lifecycle event), ``None`` once trimmed."""

    seq: int
    attempt: int
    at: float
    kind: str
    data: Any = None


class NewEvent(msgspec.Struct, frozen=True, array_like=True):
    """An event a handler emitted, not yet written: ``data`` is already JSON-encoded."""

    kind: str
    data: bytes | None
