"""A hypothesis state machine drives several virtual workers against one store (per engine).

Random submits (with sessions, 1-3 attempts, inline runs, delays), claims, heartbeats,
completions, failures, pauses, continues, cancels, requeues, reaps, purges and clock jumps.
Each rule predicts from the row as it was whether the verb may take effect, and checks the
store agreed; after every step the invariants of leases and states are checked on all rows:

- no two workers hold the same run (each running run has exactly one valid lease);
- a fenced-off write never changes a row;
- ``attempt <= max_attempts`` at every claim (and on every row);
- no session has two runs running (or one running and one paused);
- every final run has ``completed_at``; a run that is not running holds no lease;
- no run disappears before a purge deletes it (a model of expected ids).

The store is async; hypothesis is not. Every call goes through one ``asyncio.Runner`` that
lives as long as the test, so asyncpg/aiosqlite connections stay on one loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import hypothesis.strategies as st
import pytest
from conftest import PG_URL, drop_schema, new_schema_name, require_postgres
from factories import new_run, purge
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from runq.errors import Conflict, InvalidTransition
from runq.model import (
    FINAL_STATUSES,
    Completion,
    FailOutcome,
    Lease,
    Run,
    Status,
    TerminationReason,
)
from runq.seal import KeyRing
from runq.store import make_store
from runq.store.base import Store

T = TypeVar("T")

WORKERS = ("w1", "w2", "w3")
SESSIONS = (None, None, "s1", "s2", "s3")
GRACE = 60.0
RETENTION = 3600.0
#: Rows are compared with timestamps taken a few statements apart.
SLACK = 1.0

MACHINE_SETTINGS = settings(
    max_examples=75,
    stateful_step_count=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@dataclass(frozen=True)
class LeasedWrite(Generic[T]):
    """One write made with a lease, and the row before and after it."""

    worker: str
    rid: str
    attempt: int
    before: Run | None
    result: T
    after: Run | None
    held: bool


class QueueMachine(RuleBasedStateMachine):
    """Configured per test by ``machine_for`` (runner, engine, where to put databases)."""

    runner: asyncio.Runner
    engine: str
    tmp_path: Path
    key_ring: KeyRing
    examples = 0

    def __init__(self) -> None:
        super().__init__()
        cls = type(self)
        cls.examples += 1
        if self.engine == "postgres":
            self.url, self.schema = PG_URL, new_schema_name()
        else:
            path = self.tmp_path / f"machine-{cls.examples}.db"
            self.url, self.schema = f"sqlite:///{path}", "runq"
        self.store: Store = make_store(self.url, schema=self.schema, sealer=self.key_ring)
        self.run(self.store.connect())
        self.run(self.store.migrate())
        #: Ids that must exist (submitted and not purged).
        self.expected: set[str] = set()
        #: What each worker believes it holds: run id → attempt (zombies included).
        self.held: dict[str, dict[str, int]] = {w: {} for w in WORKERS}
        #: Runs whose current pause was continued and not paused again nor finished.
        self.continued: set[str] = set()
        #: Runs that were continued once and later finished (and may be requeued).
        self.ever_continued: set[str] = set()
        self.ever_paused: set[str] = set()

    # -- plumbing ----------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    def teardown(self) -> None:
        self.run(self.store.close())
        if self.engine == "postgres":
            self.run(drop_schema(self.schema))

    def snapshot(self) -> dict[str, Run]:
        page = self.run(self.store.list_jobs(limit=1000))
        assert page.total_count <= 1000
        return {r.id: r for r in page.data}

    def now(self) -> float:
        return self.run(self.store.now())

    def get(self, run_id: str) -> Run | None:
        return self.run(self.store.get(run_id))

    @staticmethod
    def holds(row: Run | None, worker: str, attempt: int) -> bool:
        """Would a fenced write by ``worker`` for ``attempt`` take effect on this row?"""
        return (
            row is not None
            and row.status is Status.RUNNING
            and row.locked_by == worker
            and row.attempt == attempt
        )

    def any_held(self) -> bool:
        return any(self.held.values())

    def pick_lease(self, data: st.DataObject) -> tuple[str, str, int] | None:
        """(worker, run id, attempt) of some lease a worker believes it holds."""
        leases = sorted((w, rid, att) for w in WORKERS for rid, att in self.held[w].items())
        if not leases:
            return None
        return data.draw(st.sampled_from(leases), label="lease")

    def pick_run(self, data: st.DataObject) -> str | None:
        if not self.expected:
            return None
        return data.draw(st.sampled_from(sorted(self.expected)), label="run")

    def became_final(self, run_id: str) -> None:
        if run_id in self.continued:
            self.continued.discard(run_id)
            self.ever_continued.add(run_id)

    # -- producer ----------------------------------------------------------------------

    @rule(
        session=st.sampled_from(SESSIONS),
        max_attempts=st.integers(1, 3),
        user=st.sampled_from([None, "u1", "u2"]),
        save_request=st.sampled_from([True, True, True, False]),
        priority=st.integers(-1, 1),
        delay=st.sampled_from([0.0, 0.0, 0.0, 30.0]),
    )
    def submit(
        self,
        session: str | None,
        max_attempts: int,
        user: str | None,
        save_request: bool,
        priority: int,
        delay: float,
    ) -> None:
        result = self.run(
            self.store.submit(
                new_run(
                    session_id=session,
                    max_attempts=max_attempts,
                    user_id=user,
                    save_request=save_request,
                    priority=priority,
                    delay_seconds=delay,
                ),
                max_queue_depth=0,
            )
        )
        assert result.created
        assert result.run.status is Status.QUEUED
        assert result.run.attempt == 0
        self.expected.add(result.run.id)

    @initialize(
        sessions=st.lists(st.sampled_from(SESSIONS), min_size=2, max_size=8),
        max_attempts=st.integers(1, 3),
    )
    def seed_runs(self, sessions: list[str | None], max_attempts: int) -> None:
        """Start every example with a few runs, so the worker rules have work at once."""
        for session in sessions:
            self.submit(session, max_attempts, "u1", True, 0, 0.0)

    # -- worker verbs ------------------------------------------------------------------

    @rule(worker=st.sampled_from(WORKERS), slots=st.integers(1, 3))
    def claim(self, worker: str, slots: int) -> None:
        before = self.snapshot()
        now = self.now()
        claimed = self.run(self.store.claim(worker, slots, deployment_id=None))
        assert len(claimed) <= slots
        assert len({r.id for r in claimed}) == len(claimed)
        sessions_taken: set[str] = set()
        for r in claimed:
            old = before[r.id]
            assert old.status is Status.QUEUED, f"claimed a {old.status} run"
            assert old.available_at <= now + SLACK, "claimed before available_at"
            assert r.status is Status.RUNNING
            assert r.attempt == old.attempt + 1, "a claim increments attempt by exactly one"
            assert r.attempt <= r.max_attempts, "attempt <= max_attempts at every claim"
            assert r.locked_by == worker
            if r.session_id is not None:
                assert r.session_id not in sessions_taken, "two runs of one session claimed"
                sessions_taken.add(r.session_id)
                siblings = [
                    s for s in before.values() if s.session_id == r.session_id and not s.is_final
                ]
                assert all(s.status not in (Status.RUNNING, Status.PAUSED) for s in siblings), (
                    "claimed while its session had a running or paused run"
                )
                assert r.id == min(s.id for s in siblings), "claimed a run that is not the head"
            self.held[worker][r.id] = r.attempt
            event("claimed a retry" if r.attempt > 1 else "claimed a first attempt")

    @precondition(any_held)
    @rule(worker=st.sampled_from(WORKERS))
    def heartbeat(self, worker: str) -> None:
        leases = [Lease(rid, att) for rid, att in sorted(self.held[worker].items())]
        if not leases:
            return
        before = self.snapshot()
        result = self.run(self.store.heartbeat_many(worker, leases))
        after = self.snapshot()
        renewed, lost = set(result.renewed), set(result.lost)
        assert renewed | lost == set(leases)
        assert not renewed & lost
        for lease in leases:
            row = before.get(lease.run_id)
            if self.holds(row, worker, lease.attempt):
                assert lease in renewed, f"a valid lease was reported lost: {lease}"
            else:
                assert lease in lost, f"an invalid lease was renewed: {lease}"
                assert after.get(lease.run_id) == row, "a lost heartbeat changed the row"
                del self.held[worker][lease.run_id]
        expected_cancel = {
            lease.run_id for lease in renewed if before[lease.run_id].cancel_requested
        }
        assert set(result.cancel_requested) == expected_cancel

    def write_with_lease(
        self, data: st.DataObject, call: Callable[[str, str, int], Coroutine[Any, Any, T]]
    ) -> LeasedWrite[T] | None:
        """Pick a lease some worker believes it holds, make the write, and read the row
        before and after; ``held`` says whether the lease was really still held."""
        picked = self.pick_lease(data)
        if picked is None:
            return None
        worker, rid, attempt = picked
        before = self.get(rid)
        result = self.run(call(worker, rid, attempt))
        after = self.get(rid)
        held = self.holds(before, worker, attempt)
        return LeasedWrite(worker, rid, attempt, before, result, after, held)

    @precondition(any_held)
    @rule(data=st.data())
    def complete(self, data: st.DataObject) -> None:
        w = self.write_with_lease(
            data,
            lambda worker, rid, attempt: self.store.complete_many(
                worker, [Completion(run_id=rid, attempt=attempt, answer={"by": worker})]
            ),
        )
        if w is None:
            return
        del self.held[w.worker][w.rid]
        if w.held:
            assert w.result.applied == (w.rid,)
            assert w.after is not None
            assert w.after.status is Status.COMPLETED
            assert w.after.answer == {"by": w.worker}
            self.became_final(w.rid)
        else:
            assert w.result.fenced_off == (w.rid,)
            assert w.after == w.before, "a fenced-off completion changed the row"
            event("fenced-off completion")

    @precondition(any_held)
    @rule(data=st.data(), retryable=st.booleans())
    def fail(self, data: st.DataObject, retryable: bool) -> None:
        w = self.write_with_lease(
            data,
            lambda worker, rid, attempt: self.store.fail(
                worker,
                Lease(rid, attempt),
                error="boom",
                retryable=retryable,
                retry_in_seconds=10.0,
            ),
        )
        if w is None:
            return
        del self.held[w.worker][w.rid]
        if not w.held:
            assert w.result is FailOutcome.FENCED_OFF
            assert w.after == w.before, "a fenced-off failure changed the row"
            event("fenced-off failure")
            return
        before, after = w.before, w.after
        assert before is not None
        assert after is not None
        if retryable and before.attempt < before.max_attempts and not before.non_idempotent:
            assert w.result is FailOutcome.RETRY_SCHEDULED
            assert after.status is Status.QUEUED
            assert after.attempt == before.attempt
        else:
            assert w.result is FailOutcome.DEAD_LETTERED
            assert after.status is Status.FAILED
            self.became_final(w.rid)

    @precondition(any_held)
    @rule(data=st.data())
    def pause(self, data: st.DataObject) -> None:
        w = self.write_with_lease(
            data,
            lambda worker, rid, attempt: self.store.pause(
                worker, Lease(rid, attempt), reason="approval", state={"a": attempt}
            ),
        )
        if w is None:
            return
        del self.held[w.worker][w.rid]
        if w.held:
            assert w.result is True
            assert w.after is not None
            assert w.after.status is Status.PAUSED
            assert w.after.resume is not None
            assert w.after.resume.state == {"a": w.attempt}
            self.continued.discard(w.rid)
            self.ever_paused.add(w.rid)
        else:
            assert w.result is False
            assert w.after == w.before, "a fenced-off pause changed the row"

    @precondition(any_held)
    @rule(data=st.data())
    def enter_non_idempotent(self, data: st.DataObject) -> None:
        w = self.write_with_lease(
            data,
            lambda worker, rid, attempt: self.store.set_non_idempotent(
                worker, Lease(rid, attempt), True
            ),
        )
        if w is None:
            return
        if w.held:
            assert w.result is True
            assert w.after is not None
            assert w.after.non_idempotent is True
        else:
            assert w.result is False
            assert w.after == w.before, "a fenced-off mark changed the row"

    @precondition(any_held)
    @rule(data=st.data())
    def settle_cancel(self, data: st.DataObject) -> None:
        w = self.write_with_lease(
            data,
            lambda worker, rid, attempt: self.store.settle_cancelled(worker, Lease(rid, attempt)),
        )
        if w is None:
            return
        if w.held:
            assert w.result is True
            assert w.after is not None
            assert w.after.status is Status.CANCELLED
            del self.held[w.worker][w.rid]
            self.became_final(w.rid)
        else:
            assert w.result is False
            assert w.after == w.before, "a fenced-off settle changed the row"

    # -- operator verbs ----------------------------------------------------------------

    @precondition(lambda self: bool(self.expected))
    @rule(data=st.data())
    def continue_(self, data: st.DataObject) -> None:
        rid = self.pick_run(data)
        if rid is None:
            return
        before = self.get(rid)
        assert before is not None
        try:
            got = self.run(self.store.continue_(rid, {"decision": rid[-4:]}))
        except Conflict:
            got = None
        after = self.get(rid)
        if before.status is Status.PAUSED:
            assert got is not None, "continue of a paused run was refused"
            assert got.status is Status.QUEUED
            assert got.max_attempts == max(before.max_attempts, before.attempt + 1)
            assert got.resume is not None
            assert got.resume.decision == {"decision": rid[-4:]}
            self.continued.add(rid)
        elif before.is_final or rid not in self.ever_paused:
            assert got is None, "continue of a final or never-paused run was accepted"
            assert after == before
        elif rid in self.continued:
            assert got == before, "a second continue must answer with the run unchanged"
            event("second continue")
            assert after == before
        else:  # continued, finished, requeued: either answer is defensible, nothing changes
            assert after == before

    @precondition(lambda self: bool(self.expected))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        rid = self.pick_run(data)
        if rid is None:
            return
        before = self.get(rid)
        assert before is not None
        try:
            got: Run | None = self.run(self.store.cancel(rid))
        except Conflict:
            got = None
        after = self.get(rid)
        if before.status in (Status.QUEUED, Status.PAUSED):
            assert got is not None
            assert got.status is Status.CANCELLED
            assert got.resume is None
            self.became_final(rid)
        elif before.status is Status.RUNNING:
            assert got is not None
            assert got.status is Status.RUNNING
            assert got.cancel_requested is True
        elif before.status is Status.CANCELLED:
            assert got == before
        else:
            assert got is None, f"cancel of a {before.status} run was accepted"
            assert after == before

    @precondition(lambda self: bool(self.expected))
    @rule(data=st.data(), clear=st.booleans())
    def requeue(self, data: st.DataObject, clear: bool) -> None:
        rid = self.pick_run(data)
        if rid is None:
            return
        before = self.get(rid)
        assert before is not None
        try:
            got: Run | None = self.run(
                self.store.requeue(
                    rid, clear_cancellation=clear, force=True, lock_grace_seconds=GRACE
                )
            )
        except InvalidTransition:
            got = None
        if before.status in (Status.FAILED, Status.CANCELLED):
            assert got is not None
            assert got.status is Status.QUEUED
            assert got.max_attempts == before.attempt + 1
            assert got.cancel_requested is (before.cancel_requested and not clear)
        else:
            assert got is None
            assert self.get(rid) == before

    # -- maintenance -------------------------------------------------------------------

    @rule(limit=st.sampled_from([1, 100]))
    def reap(self, limit: int) -> None:
        before = self.snapshot()
        now = self.now()
        report = self.run(self.store.reap_stale(lock_grace_seconds=GRACE, limit=limit))
        after = self.snapshot()
        handled = set(report.requeued_ids) | set(report.dead_lettered_ids)
        if handled:
            event("reaped")
        assert report.requeued == len(report.requeued_ids)
        assert report.dead_lettered == len(report.dead_lettered_ids)
        assert len(handled) <= limit
        for rid in handled:
            old, new = before[rid], after[rid]
            assert old.status is Status.RUNNING
            assert old.locked_at is not None
            assert old.locked_at < now - GRACE + SLACK, "reaped a fresh lease"
            if old.non_idempotent or not old.has_request:
                assert new.status is Status.FAILED
                assert new.termination_reason is TerminationReason.NOT_RETRYABLE
            elif old.attempt >= old.max_attempts:
                assert new.status is Status.FAILED
                assert new.termination_reason is TerminationReason.RETRIES_EXHAUSTED
            else:
                assert new.status is Status.QUEUED
                assert rid in report.requeued_ids
            if new.is_final:
                self.became_final(rid)
        if limit >= len(before):
            for rid, old in before.items():
                if (
                    old.status is Status.RUNNING
                    and old.locked_at is not None
                    and old.locked_at < now - GRACE - SLACK
                ):
                    assert rid in handled, "a stale lease was left behind"
        for rid, old in before.items():
            if rid not in handled:
                assert after[rid] == old, "the reaper changed a run it did not report"

    @rule(seconds=st.sampled_from([1.0, 5.0, 20.0, 45.0, 61.0, 90.0, 3700.0]))
    def jump(self, seconds: float) -> None:
        self.store.clock_offset_seconds += seconds

    @rule()
    def purge(self) -> None:
        before = self.snapshot()
        now_before = self.now()
        report = self.run(
            purge(self.store, retention_seconds=RETENTION, paused_retention_seconds=0)
        )
        now_after = self.now()
        after = self.snapshot()
        deleted = set(before) - set(after)
        assert set(after) <= set(before)
        assert report.deleted == len(deleted)
        for rid in deleted:
            old = before[rid]
            assert old.is_final, f"purge deleted a {old.status} run"
            assert old.completed_at is not None
            assert old.completed_at < now_after - RETENTION + SLACK
        for rid, old in before.items():
            expired = old.completed_at is not None and (
                old.completed_at < now_before - RETENTION - SLACK
            )
            if old.is_final and expired:
                assert rid in deleted, "an expired final run survived the purge"
        self.expected -= deleted
        if deleted:
            event("purged")
        for worker in WORKERS:
            for rid in deleted & set(self.held[worker]):
                del self.held[worker][rid]

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def rows_agree_with_the_model(self) -> None:
        rows = self.snapshot()
        assert set(rows) == self.expected, "a run appeared or disappeared outside purge"
        running_by_session: dict[str, list[str]] = {}
        for rid, run in rows.items():
            assert run.attempt <= run.max_attempts, f"{rid}: attempt > max_attempts"
            if run.status in FINAL_STATUSES:
                assert run.completed_at is not None, f"{rid}: final without completed_at"
                assert run.termination_reason is not None, f"{rid}: final without a reason"
            if run.status is Status.RUNNING:
                assert run.locked_by is not None
                assert run.attempt >= 1
                holders = [w for w in WORKERS if self.held[w].get(rid) == run.attempt]
                assert holders == [run.locked_by], f"{rid}: valid lease holders {holders}"
            else:
                assert (run.locked_by, run.locked_at) == (None, None), f"{rid}: stray lease"
            if run.session_id is not None and run.status in (Status.RUNNING, Status.PAUSED):
                running_by_session.setdefault(run.session_id, []).append(rid)
        for session, active in running_by_session.items():
            assert len(active) <= 1, f"session {session} has {len(active)} running/paused runs"


def machine_for(
    runner: asyncio.Runner, engine: str, tmp_path: Path, key_ring: KeyRing
) -> type[QueueMachine]:
    return type(
        f"QueueMachine_{engine}",
        (QueueMachine,),
        {
            "runner": runner,
            "engine": engine,
            "tmp_path": tmp_path,
            "key_ring": key_ring,
            "examples": 0,
        },
    )


@pytest.mark.timeout(240)
def test_store_state_machine(engine: str, tmp_path: Path, key_ring: KeyRing) -> None:
    if engine == "postgres":
        require_postgres()
    with asyncio.Runner() as runner:
        machine = machine_for(runner, engine, tmp_path, key_ring)
        run_state_machine_as_test(machine, settings=MACHINE_SETTINGS)
