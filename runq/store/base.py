"""The Store protocol: the one boundary to storage. SQL never leaves ``runq/store/``.

Every verb is one conditional statement (or one short transaction on SQLite) whose
affected rows decide the winner; the loser changes nothing. Writes of a worker are
fenced on ``(id, attempt, locked_by, status = 'running')``. Lease arithmetic and every
timestamp use the database clock (plus ``clock_offset_seconds``, which only tests set).
A statement that waits for several run rows takes them in id order, and a write the
database aborted for contention (a deadlock with someone else's transaction, a
serialization failure) is run again by the store; one that keeps being aborted raises
``StoreContention``, a ``StoreUnavailable`` the callers retry (docs/INTERNALS.md, "Lock
order").

Sealed columns (payload, answer, resume_state, decision, error_detail) are sealed by the store with
its ``Sealer`` on the way in and opened on the way out, so callers only see Python
values. Payloads are JSON (msgspec); a value that cannot be encoded raises
``InvalidPayload`` before anything is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, Unpack, runtime_checkable

from runq.limits import LimitRules, LimitState, Pause
from runq.listing import JobListing, Page, RunCursor, RunFilter, RunList
from runq.model import (
    BudgetBlock,
    ClaimedRuns,
    Completion,
    FailOutcome,
    FenceResult,
    HeartbeatResult,
    Lease,
    NewEvent,
    NewRun,
    QueuedCount,
    QueueHealth,
    ReapReport,
    Run,
    RunEvent,
    ScheduleState,
    SlotFire,
    Stats,
    SubmitResult,
    UsageKey,
    UsageTotals,
    WorkerInfo,
)
from runq.store.notifications import Notifications
from runq.store.replication import ReplicationReport


@runtime_checkable
class Store(Protocol):
    #: "sqlite" or "postgres".
    engine: str
    #: Added to the database clock everywhere; tests use it to jump time. Never set in production.
    clock_offset_seconds: float
    #: ``[limits]`` every claim of this process applies (empty: no limits).
    limits: LimitRules

    # -- lifecycle ---------------------------------------------------------------------

    async def connect(self) -> None:
        """Open the connection(s). Raises ``StoreUnavailable`` naming the URL (without password)."""

    async def close(self) -> None: ...

    async def migrate(self) -> int:
        """Apply pending migrations; safe when replicas start at once. Returns how many ran."""

    async def check_seal_key(self) -> str | None:
        """The fleet's seal key fingerprint (the sealing key's id, never the key): recorded
        when absent, moved to this store's sealing key when the ring also holds the recorded
        one (a rotation). Returns the recorded id (hex) when this store's keys cannot open
        values sealed under it, else None. Called after ``migrate``."""

    async def schema_is_current(self) -> bool:
        """True when every migration this version knows has been applied (``/readyz``)."""

    def notifications(self) -> Notifications:
        """This store's wake-ups, cancels and event messages in this process: one object
        for the store's life. Where ``crosses_processes`` is true (PostgreSQL) ``send``
        reaches every replica and a daemon runs ``listen``; otherwise delivery stays in
        this process and readers elsewhere poll."""

    async def ping(self) -> None:
        """One trivial round trip; raises ``StoreUnavailable`` when the database does not
        answer (on PostgreSQL, also when the server reached no longer takes writes)."""

    @property
    def server(self) -> str:
        """The database written to now: ``host:port`` of the PostgreSQL primary the latest
        connection reached ("" before the first; it follows a failover), or the SQLite
        file."""

    async def replication(self) -> ReplicationReport:
        """What an acknowledged write survives: the replication mode of the database
        (``runq.store.replication``), read now."""

    async def now(self) -> float:
        """The database clock (plus offset), epoch seconds."""

    # -- producer ----------------------------------------------------------------------

    async def submit(
        self,
        new: NewRun,
        *,
        max_queue_depth: int,
        wake: bool = False,
        max_delayed: int = 0,
        max_queued_per_user: int = 0,
    ) -> SubmitResult:
        """Insert a queued run, attempt 0.

        Idempotency: a key already used by the same ``actor.user_id`` returns the
        existing run with ``created=False`` (checked before the depth gate, so a
        duplicate is answered even when the queue is full); the same key for another
        component raises ``IdempotencyConflict``. Depth gates (0 = unbounded) raise
        ``QueueFull``: a due run when ``max_queue_depth`` queued runs are due, a delayed run
        when ``max_delayed`` queued runs are delayed (runs far in the future never count
        against the due runs), and a run of a user who has ``max_queued_per_user`` queued
        runs. ``available_at = now + delay_seconds``.
        ``save_request=False`` stores no payload (``has_request`` false). ``wake``: where the
        engine has LISTEN/NOTIFY, send ``NOTIFY 'wake'`` in the same statement when the run was
        inserted (delivered at commit, one round trip less than a NOTIFY after it); engines
        without it ignore the flag.
        """

    async def submit_many(self, news: Sequence[NewRun]) -> list[str]:
        """Bulk insert without idempotency keys or depth gate (imports, benchmarks). Returns ids."""

    async def submit_batch(
        self,
        news: Sequence[NewRun],
        *,
        max_queue_depth: int,
        max_delayed: int = 0,
        max_queued_per_user: int = 0,
    ) -> list[SubmitResult]:
        """``submit`` of every item, in order, in one transaction: all or nothing.

        Each item follows submit's rules (a held unique key, then an idempotency key of the
        same user, answer with the existing run, ``created=False``; a key reused for another
        component raises ``IdempotencyConflict``); a key repeated inside the batch answers
        with the earlier item's run. The depth gates count the batch's new runs on top of
        the queued ones: when they do not all fit, ``QueueFull`` and nothing is stored. One
        result per item, in order. No wake-up is sent (the caller sends one for the batch).
        """

    async def get(self, run_id: str) -> Run | None: ...

    async def cancel(self, run_id: str) -> Run:
        """``queued``/``paused`` → ``cancelled`` at once (resume state cleared); ``running`` →
        ``cancel_requested`` recorded, the executor stops at its next checkpoint or heartbeat;
        already ``cancelled`` → unchanged. ``completed``/``failed`` raise ``Conflict``;
        unknown id raises ``NotFound``."""

    async def continue_(self, run_id: str, decision: Any) -> Run:
        """``paused`` → ``queued`` with ``decision`` stored, ``max_attempts = attempt + 1``,
        ``available_at = now``, ``pause_reason`` kept for history. A second continue of the
        same pause while that continuation is queued or running returns the run unchanged.
        A run never paused, or final, raises ``Conflict``; unknown id ``NotFound``."""

    async def requeue(
        self, run_id: str, *, clear_cancellation: bool, force: bool, lock_grace_seconds: float
    ) -> Run:
        """Operator requeue: only ``failed``/``cancelled`` (else ``InvalidTransition``);
        a ``failed`` run whose ``completed_at`` is within ``lock_grace_seconds`` raises ``Conflict``
        unless ``force``. Sets ``queued``, ``max_attempts = attempt + 1``, ``available_at = now``,
        clears ``error``, ``termination_reason``, ``completed_at``, the lease and the
        non-idempotent mark; keeps ``cancel_requested`` unless ``clear_cancellation``."""

    # -- worker ------------------------------------------------------------------------

    async def claim(
        self,
        worker_id: str,
        slots: int,
        *,
        deployment_id: str | None,
        serialize_sessions: bool = True,
        blocked: BudgetBlock | None = None,
        run_id: str | None = None,
    ) -> ClaimedRuns:
        """Claim up to ``slots`` queued runs in one statement, ordered by ``priority`` (lower
        first), then ``available_at``, then id. Only ``available_at <= now``; affinity: runs
        with no deployment, or with ``deployment_id`` equal to the worker's; the session rule
        when ``serialize_sessions`` (only a session's oldest non-final run, and only while no
        run of the session is running or paused); nothing ``blocked`` by the budget. Sets
        ``running``, ``attempt + 1``, ``locked_by``, ``locked_at = started_at = now``.
        ``run_id`` claims that one run only (the sync transport), under the same rules.

        A claimed run whose sealed values do not open with this store's keys is given back
        at once (``queued``, attempt not spent, the reason in ``error``) and named in the
        result's ``unopenable`` instead of being returned."""

    async def give_back(self, worker_id: str, leases: Sequence[Lease]) -> None:
        """Undo claims whose handlers never started (fenced on each lease): ``queued`` again,
        the attempt not spent, a ``released`` event. Leases no longer held are skipped."""

    async def heartbeat_many(self, worker_id: str, leases: Sequence[Lease]) -> HeartbeatResult:
        """Renew every lease held by ``worker_id`` in one statement (``locked_at = now``) and
        refresh the worker's ``last_seen_at``. Leases not renewed are reported ``lost``,
        except those whose row another transaction held at that moment (``busy``: a
        heartbeat never waits for a run row, so it can never be part of a lock cycle);
        renewed runs whose cancel was requested are reported in ``cancel_requested``."""

    async def complete_many(self, worker_id: str, completions: Sequence[Completion]) -> FenceResult:
        """Fenced, one statement for the whole batch: ``completed`` with the answer (when
        ``keep_answer``), ``termination_reason``, ``completed_at``; lease, resume state and
        decision cleared."""

    async def fail(
        self,
        worker_id: str,
        lease: Lease,
        *,
        error: str,
        retryable: bool,
        retry_in_seconds: float,
        error_detail: str | None = None,
    ) -> FailOutcome:
        """Fenced. When ``retryable`` and ``attempt < max_attempts`` and the run is not marked
        non-idempotent: ``queued`` with ``available_at = now + retry_in_seconds`` (the caller
        computes the jittered backoff, honouring any Retry-After). Otherwise ``failed`` with
        ``retries_exhausted`` (retryable) or ``not_retryable`` and ``completed_at``. ``error``
        is stored as given (the caller keeps payloads out of it); ``error_detail``, the
        handler's full message, is sealed into its own column (NULL when None), which only
        ``error_detail`` opens."""

    async def pause(
        self, worker_id: str, lease: Lease, *, reason: str, state: Any, summary: str | None = None
    ) -> bool:
        """Fenced: ``paused``, resume state sealed, decision cleared, lease cleared;
        ``summary`` (already cleaned) stored in clear for approvers. False when fenced off."""

    async def settle_cancelled(self, worker_id: str, lease: Lease) -> bool:
        """Fenced: a running run whose cancel was observed becomes ``cancelled``."""

    async def set_non_idempotent(self, worker_id: str, lease: Lease, inside: bool) -> bool:
        """Fenced: mark (or unmark) the run as inside a non-idempotent write section."""

    async def record_usage(
        self, worker_id: str, lease: Lease, *, tokens: int, cost: float, keys: Sequence[UsageKey]
    ) -> None:
        """Add usage to the run (unfenced: the money was spent either way) and to each budget
        counter in ``keys`` (upsert)."""

    async def count_claimed_run(self, keys: Sequence[UsageKey]) -> None:
        """Add one run to each budget counter in ``keys`` (called once per first claim)."""

    async def usage_totals(self, keys: Sequence[UsageKey]) -> dict[UsageKey, UsageTotals]:
        """Current totals for each requested counter (missing counters are zero)."""

    async def usage_in_periods(
        self, periods: Sequence[tuple[str, float]]
    ) -> dict[UsageKey, UsageTotals]:
        """Every budget counter whose ``(scope, period_start)`` is in ``periods`` (the budget
        gate reads all counters of the current periods once, then decides who is blocked)."""

    # -- maintenance -------------------------------------------------------------------

    async def reap_stale(self, *, lock_grace_seconds: float, limit: int) -> ReapReport:
        """The reaper's rules, in order, for at most ``limit`` running runs whose ``locked_at``
        is older than ``lock_grace_seconds``: inside a non-idempotent section, or with no
        saved request, or out of attempts → ``failed``; otherwise ``queued`` with
        ``available_at = now``. Each UPDATE rechecks staleness (a renewed lease wins,
        counted as ``skipped``)."""

    async def purge_batch(
        self, *, retention_seconds: float, paused_retention_seconds: float, limit: int
    ) -> int:
        """Delete at most ``limit`` runs in one statement and return how many: final runs
        whose ``completed_at`` is older than ``retention_seconds`` and, only when
        ``paused_retention_seconds > 0``, paused runs not updated for that long. The caller
        loops until a batch comes back short, so no statement holds locks for long."""

    async def register_worker(self, info: WorkerInfo) -> None: ...

    async def remove_worker(self, worker_id: str) -> None: ...

    async def prune_workers(self, *, max_age_seconds: float) -> int: ...

    async def list_workers(self, *, max_age_seconds: float) -> list[WorkerInfo]: ...

    # -- reads for operators -----------------------------------------------------------

    async def stats(self) -> Stats: ...

    async def health(
        self, *, lock_grace_seconds: float, worker_max_age_seconds: float
    ) -> QueueHealth:
        """Counts, oldest queued age overall and per deployment ("" for none), expired
        leases and live workers, in as few queries as the engine allows."""

    async def list_jobs(self, **listing: Unpack[JobListing]) -> Page:
        """Paged listing (``runq.listing.JobListing``: page, limit, sort, filter, cursor).
        ``sort_by`` outside ``SORTABLE_FIELDS`` falls back to ``created_at``; never
        interpolated. ``after``: keyset paging from a cursor (meaningful when sorted by
        ``created_at``; then ``page`` should be 1, and ``next_cursor`` of the answer
        continues the listing). Both engines share it (``runq.store.listings``)."""

    async def list_runs(self, where: RunFilter, *, after: RunCursor | None, limit: int) -> RunList:
        """At most ``limit`` runs matching ``where``, newest first (created_at, id), after the
        cursor ``after``; one statement, no count."""

    async def reseal_page(self, *, after_id: str, limit: int) -> tuple[str | None, int]:
        """Key rotation: re-seal the sealed columns of up to ``limit`` runs with id > ``after_id``
        under the sealing key. Returns (last id seen or None when done, values re-sealed)."""

    async def error_detail(self, run_id: str) -> str | None:
        """A run's sealed full error text, opened: for admins only (``/queue/jobs/{id}``,
        ``runq jobs show``). None when the run is unknown or kept none."""

    async def count_runs(self) -> int: ...

    async def run_ids_with_prefix(self, prefix: str, *, limit: int) -> list[str]:
        """Up to ``limit`` run ids that start with ``prefix``, in id order: how the CLI
        turns a pasted prefix into one run (as git does with commit ids). Meant for an
        operator's one-off lookup, after an exact ``get`` missed."""

    # -- schedules ---------------------------------------------------------------------

    async def schedule_states(self, names: Sequence[str]) -> tuple[float, list[ScheduleState]]:
        """The database clock and the state of each named schedule; a name seen for the
        first time gets a row whose cursor is now (a new schedule never fires for the past)."""

    async def fire_schedule_slot(
        self, name: str, slot_at: float, new: NewRun, *, skip_if_running: bool
    ) -> SlotFire:
        """Record slot ``slot_at`` of schedule ``name`` and insert ``new`` as its run, in one
        transaction. The slot's primary key makes this happen once across the fleet: a
        second call for the same slot records nothing and inserts nothing. With
        ``skip_if_running``, when the schedule's previous run is not final the slot is
        recorded without a run. Moves the schedule's cursor to the slot."""

    async def advance_schedule_cursor(self, name: str, cursor_at: float) -> None:
        """Mark every slot up to ``cursor_at`` handled (only ever forward)."""

    async def set_schedule_paused(self, name: str, paused: bool) -> ScheduleState:
        """Pause or resume fleet-wide; resuming moves the cursor to now, so slots that fell
        inside the pause do not fire."""

    async def recent_schedule_slots(
        self, name: str, *, limit: int
    ) -> list[tuple[float, str | None]]:
        """The newest ``limit`` recorded slots of a schedule: (slot time, run id or None
        when the slot was skipped by the overlap rule), newest first."""

    async def prune_schedule_slots(self, name: str, *, before: float) -> int:
        """Delete the schedule's slot rows older than ``before``; returns how many. Slots
        behind the cursor are never fired again, so old rows are history only."""

    # -- limits -----------------------------------------------------------------------

    async def add_pause(
        self, kind: str, target: str, *, reason: str | None, created_by: str | None
    ) -> tuple[Pause, bool]:
        """Pause a component pattern (``kind = "component"``) or a deployment fleet-wide:
        every claim skips matching queued runs from the next statement on; runs already
        running go on. Returns (the pause, created); pausing a paused target returns the
        existing pause with ``created = False``."""

    async def remove_pause(self, key: str, *, kind: str = "", target: str = "") -> Pause | None:
        """Resume: delete the pause with id ``key``, or the one of (``kind``, ``target``).
        None when there was none."""

    async def list_pauses(self) -> list[Pause]:
        """Active pauses, oldest first."""

    async def limits_state(self) -> LimitState:
        """The database clock, running runs per component and the rate windows of
        ``limits``'s patterns, read together (to say why a run waits)."""

    async def session_ahead(self, run_id: str, session_id: str) -> bool:
        """True when the session rule holds ``run_id`` back."""

    async def queued_by_component(self, blocked: BudgetBlock | None = None) -> list[QueuedCount]:
        """Queued runs per (component, deployment id or ''): ready now, delayed, and the
        ready runs ``blocked`` by the budget (the claim's own exclusion). For the exporter's
        held-back counts."""

    # -- the event log -----------------------------------------------------------------

    async def append_events(self, worker_id: str, lease: Lease, events: Sequence[NewEvent]) -> bool:
        """Fenced: append ``events`` to the run's log in one transaction, numbered after the
        last event, stamped with the database clock and the lease's attempt, data sealed per
        (run, seq). False (nothing written) when the lease no longer holds."""

    async def append_events_many(
        self, worker_id: str, batches: Sequence[tuple[Lease, Sequence[NewEvent]]]
    ) -> set[str]:
        """``append_events`` for several executions of one worker in one transaction; returns
        the ids of the runs whose fence held (the others got nothing written)."""

    async def list_events(self, run_id: str, *, after: int, limit: int) -> list[RunEvent]:
        """Up to ``limit`` events of the run with ``seq > after``, in order, data opened."""

    async def trim_events(self, run_id: str, level: str, redacted_max_chars: int) -> None:
        """Cut a settled run's stored events down to ``[privacy] level``: ``full`` keeps them,
        ``redacted`` keeps redacted data, ``metadata`` drops handler data, ``none`` drops
        every detail (kind, seq and time stay)."""

    # -- console: the operator console's grouped reads ---------------------------------

    async def finished_per_minute(
        self, *, window_seconds: float
    ) -> tuple[float, list[tuple[float, str, int]]]:
        """The database clock, and the final runs whose ``completed_at`` lies within the last
        ``window_seconds``, counted per (minute start, status): one grouped read over the
        final runs' ``completed_at`` index, never a scan of the run table."""

    async def running_by_worker(self) -> dict[str, int]:
        """Running runs per lease holder (worker id): one grouped read over the running
        runs' lease index."""
