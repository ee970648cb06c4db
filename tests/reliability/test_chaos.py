"""Fleet chaos: three ``runq serve`` replicas on one PostgreSQL, under SIGKILL and pauses.

A producer submits runs over HTTP (a third each with ``max_attempts`` 1, 2 and 3), each
with an ``Idempotency-Key`` and retried on another replica until acknowledged. The handler
(``chaos_handlers.chaos``) sleeps 0 to 300 ms; for a tenth of the runs it writes one row per
execution into a side table inside ``ctx.non_idempotent()``. Meanwhile a random replica is
SIGKILLed about every 2 seconds and restarted at once, and every few seconds another one is
frozen with SIGSTOP for longer than ``lock_grace_seconds`` and then thawed: a "zombie"
worker that wakes up after its leases were reaped, whose writes the fence must discard.

A trigger on the run table records every change of status, attempt or lease holder
(``chaos_audit``), so the checks read what the database did, not what a worker believed.
At the end the test proves the guarantees of docs/design.md and prints the counts:

* every acknowledged submission exists, exactly once (retries were idempotent);
* every run is final within ``lock_grace_seconds`` plus a margin after the last fault;
* no run completed twice, and the completion the database kept is the one of the attempt
  and the process that held the lease (worker registry pid = the answer's pid);
* no run executed more than ``max_attempts`` times, no attempt executed twice, and every
  ``max_attempts = 1`` run executed at most once;
* every execution that died inside its non-idempotent section left its run ``failed`` /
  ``not_retryable`` at that attempt: never executed again;
* the state machine held: running → X keeps the attempt, a claim adds one, nothing
  leaves a final status;
* fenced-off writes happened (the zombies) and none of them changed a row.

The default variant runs 600 runs for about 20 seconds of faults; the ``long`` one 3,000
runs for two minutes (``pytest -m long`` or ``RUNQ_LONG=1``).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import anyio
import asyncpg
import httpx
import pytest
from helpers import wait_for
from serve_harness import PG_URL, RunqServer, RunqSetup, ServeFactory

from reliability.chaos_handlers import read_executions
from runq.model import Run, Status, TerminationReason

pytestmark = [pytest.mark.anyio, pytest.mark.daemon, pytest.mark.postgres]

LOCK_GRACE = 3.0
#: After the last fault, what the fleet may take beyond the lease grace to settle everything
#: (a restarted replica's start, the reaper's poll, the last backlog, a loaded 2-core box).
FINAL_MARGIN = 30.0
QUEUE = {
    "poll_interval": 0.25,
    "lock_grace_seconds": LOCK_GRACE,
    "stop_timeout_seconds": 1,
    "max_concurrency": 16,
    "max_queue_depth": 0,
    "retry_delay_seconds": 0.2,
}
FINAL = {Status.COMPLETED, Status.FAILED, Status.CANCELLED}


@dataclass(frozen=True)
class Plan:
    runs: int
    submit_seconds: float
    chaos_seconds: float
    kill_every: float = 2.0
    pause_every: float = 7.0
    producers: int = 16
    seed: int = 20261130


SHORT = Plan(runs=600, submit_seconds=14.0, chaos_seconds=20.0)
LONG = Plan(runs=3000, submit_seconds=100.0, chaos_seconds=120.0, pause_every=9.0)


# -- the database side: audit trigger and side table -----------------------------------------


def audit_ddl(s: str) -> list[str]:
    return [
        f"""CREATE TABLE {s}.chaos_side (
                run_id text NOT NULL, attempt integer NOT NULL, pid integer NOT NULL,
                finished boolean NOT NULL DEFAULT false,
                at timestamptz NOT NULL DEFAULT clock_timestamp())""",
        f"CREATE INDEX ON {s}.chaos_side (run_id)",
        f"""CREATE TABLE {s}.chaos_audit (
                seq bigserial PRIMARY KEY, run_id text NOT NULL,
                old_status text, new_status text, old_attempt integer, new_attempt integer,
                old_locked_by text, new_locked_by text, error text, reason text,
                at timestamptz NOT NULL DEFAULT clock_timestamp())""",
        f"""CREATE FUNCTION {s}.chaos_audit_fn() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO {s}.chaos_audit (run_id, old_status, new_status, old_attempt,
                    new_attempt, old_locked_by, new_locked_by, error, reason)
                VALUES (NEW.id, OLD.status, NEW.status, OLD.attempt, NEW.attempt,
                    OLD.locked_by, NEW.locked_by, NEW.error, NEW.termination_reason);
                RETURN NULL;
            END $$""",
        f"""CREATE TRIGGER chaos_audit AFTER UPDATE ON {s}.runs FOR EACH ROW
            WHEN (OLD.status IS DISTINCT FROM NEW.status
                  OR OLD.attempt IS DISTINCT FROM NEW.attempt
                  OR OLD.locked_by IS DISTINCT FROM NEW.locked_by)
            EXECUTE FUNCTION {s}.chaos_audit_fn()""",
    ]


# -- the producer ---------------------------------------------------------------------------------


@dataclass
class Produced:
    acked: dict[int, str] = field(default_factory=dict)
    max_attempts: dict[int, int] = field(default_factory=dict)
    side: set[int] = field(default_factory=set)
    outcomes: Counter[str] = field(default_factory=Counter)
    replayed: int = 0
    gave_up: list[int] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


def submission(i: int, rng: random.Random) -> dict[str, Any]:
    side = i % 10 == 0
    return {
        "component_type": "task",
        "component_id": "chaos",
        "payload": {"i": i, "sleep_ms": rng.randint(0, 300), "side": side},
        "max_attempts": 1 + i % 3,
    }


async def produce(servers: list[RunqServer], plan: Plan, produced: Produced) -> None:
    """Submit ``plan.runs`` runs spread over ``plan.submit_seconds``; retry each (same key,
    next replica) until a replica acknowledges it, for at most a minute after the plan."""
    rng = random.Random(plan.seed)
    bodies = [submission(i, rng) for i in range(plan.runs)]
    for i, body in enumerate(bodies):
        produced.max_attempts[i] = body["max_attempts"]
        if body["payload"]["side"]:
            produced.side.add(i)
    start = time.monotonic()
    give_up_at = start + plan.submit_seconds + 60.0
    spacing = plan.submit_seconds / plan.runs
    next_index = iter(range(plan.runs))

    async def one(client: httpx.AsyncClient, i: int) -> None:
        headers = {"Idempotency-Key": f"chaos-{plan.seed}-{i}"}
        tries = 0
        while time.monotonic() < give_up_at:
            server = servers[(i + tries) % len(servers)]
            tries += 1
            try:
                response = await client.post(f"{server.url}/runs", json=bodies[i], headers=headers)
            except httpx.HTTPError as e:
                produced.outcomes[type(e).__name__] += 1
                await anyio.sleep(0.1)
                continue
            produced.outcomes[str(response.status_code)] += 1
            if response.status_code == 202:
                produced.acked[i] = response.json()["run_id"]
                if response.headers.get("Idempotent-Replayed") == "true":
                    produced.replayed += 1
                return
            if response.status_code < 500:
                produced.refused.append(f"{i}: {response.status_code} {response.text[:200]}")
                return
            await anyio.sleep(0.05)
        produced.gave_up.append(i)

    async def worker(client: httpx.AsyncClient) -> None:
        for i in next_index:
            due = start + i * spacing
            if due > time.monotonic():
                await anyio.sleep(due - time.monotonic())
            await one(client, i)

    limits = httpx.Limits(max_connections=plan.producers * 2, max_keepalive_connections=0)
    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(3.0), limits=limits) as client,
        anyio.create_task_group() as tg,
    ):
        for _ in range(plan.producers):
            tg.start_soon(worker, client)


# -- the faults -----------------------------------------------------------------------------------


@dataclass
class Faults:
    kills: int = 0
    pauses: int = 0
    last_fault: float = 0.0
    events: list[str] = field(default_factory=list)


def _signal_process(process: Any, sig: signal.Signals) -> None:
    if process is not None and process.poll() is None:
        os.kill(process.pid, sig)


async def busiest(servers: list[RunqServer], schema: str) -> RunqServer | None:
    """The live replica holding the most leases right now (a pause there strands the most
    runs), from the run table and the worker registry."""
    conn = await asyncpg.connect(PG_URL)
    try:
        rows = await conn.fetch(
            f"SELECT w.pid, count(*) AS n FROM {schema}.runs r"
            f" JOIN {schema}.workers w ON w.id = r.locked_by"
            " WHERE r.status = 'running' GROUP BY w.pid"
        )
    finally:
        await conn.close()
    held = {row["pid"]: row["n"] for row in rows}
    live = [s for s in servers if s.process is not None and s.process.poll() is None]
    live.sort(key=lambda s: held.get(s.pid, 0), reverse=True)
    return live[0] if live else None


async def inject_faults(servers: list[RunqServer], plan: Plan, faults: Faults, schema: str) -> None:
    rng = random.Random(plan.seed + 1)
    started = time.monotonic()
    end = started + plan.chaos_seconds

    async def until(delay: float) -> bool:
        """Sleep ``delay`` or until the end of the chaos; False when the chaos is over."""
        await anyio.sleep(max(min(delay, end - time.monotonic()), 0))
        return time.monotonic() < end

    async def killer() -> None:
        while await until(plan.kill_every * rng.uniform(0.75, 1.25)):
            victim = rng.choice(servers)
            victim.kill()
            faults.kills += 1
            faults.last_fault = time.monotonic()
            faults.events.append(f"{faults.last_fault - started:6.2f}s SIGKILL {victim.name}")
            await victim.start(wait_ready=False)

    async def pauser() -> None:
        while plan.pause_every > 0 and await until(plan.pause_every * rng.uniform(0.75, 1.25)):
            victim = await busiest(servers, schema)
            process = victim.process if victim is not None else None
            if victim is None or process is None or process.poll() is not None:
                continue
            _signal_process(process, signal.SIGSTOP)
            faults.pauses += 1
            at = time.monotonic() - started
            faults.events.append(f"{at:6.2f}s SIGSTOP {victim.name}")
            try:
                # Longer than the grace: its leases go stale and a peer reaps them.
                await anyio.sleep(LOCK_GRACE + 1.5)
            finally:
                _signal_process(process, signal.SIGCONT)
            faults.last_fault = time.monotonic()
            faults.events.append(f"{faults.last_fault - started:6.2f}s SIGCONT {victim.name}")

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(killer)
            tg.start_soon(pauser)
    finally:
        for server in servers:
            _signal_process(server.process, signal.SIGCONT)


# -- reading the outcome --------------------------------------------------------------------------


@dataclass
class Evidence:
    runs: dict[str, Run]
    executions: list[tuple[str, int, int]]
    side: list[asyncpg.Record]
    audit: list[asyncpg.Record]
    worker_pids: dict[str, int]
    row_count: int


async def collect(setup: RunqSetup, run_ids: list[str]) -> Evidence:
    s = setup.schema
    conn = await asyncpg.connect(PG_URL)
    try:
        side = await conn.fetch(f"SELECT * FROM {s}.chaos_side ORDER BY at")
        audit = await conn.fetch(f"SELECT * FROM {s}.chaos_audit ORDER BY seq")
        workers = await conn.fetch(f"SELECT id, pid FROM {s}.workers")
        row_count = await conn.fetchval(f"SELECT count(*) FROM {s}.runs")
    finally:
        await conn.close()
    runs: dict[str, Run] = {}
    limiter = anyio.Semaphore(16)
    async with setup.queue() as q:

        async def read(run_id: str) -> None:
            async with limiter:
                run = await q.get(run_id)
            if run is not None:
                runs[run_id] = run

        async with anyio.create_task_group() as tg:
            for run_id in run_ids:
                tg.start_soon(read, run_id)
    return Evidence(
        runs=runs,
        executions=read_executions(setup.workdir),
        side=side,
        audit=audit,
        worker_pids={w["id"]: w["pid"] for w in workers},
        row_count=row_count,
    )


def count_log_events(servers: list[RunqServer], *events: str) -> int:
    text = "".join(server.logs() for server in servers)
    return sum(text.count(f'"{event}"') for event in events)


async def unfinished_runs(setup: RunqSetup) -> int:
    conn = await asyncpg.connect(PG_URL)
    try:
        value: int = await conn.fetchval(
            f"SELECT count(*) FROM {setup.schema}.runs"
            " WHERE status NOT IN ('completed', 'failed', 'cancelled')"
        )
    finally:
        await conn.close()
    return value


# -- the test -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "plan",
    [pytest.param(SHORT, id="short"), pytest.param(LONG, id="long", marks=pytest.mark.long)],
)
async def test_a_fleet_under_sigkill_and_pauses_loses_nothing_and_repeats_nothing_unsafe(
    plan: Plan,
    pg_setup: RunqSetup,
    pg_serve_factory: ServeFactory,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with pg_setup.queue():
        pass  # migrated: the audit trigger can go onto the run table
    conn = await asyncpg.connect(PG_URL)
    try:
        for statement in audit_ddl(pg_setup.schema):
            await conn.execute(statement)
    finally:
        await conn.close()

    config = {
        "queue": QUEUE,
        "routing": {"*": "postgres"},
        "components": {"task/chaos": "reliability.chaos_handlers:chaos"},
    }
    env = {"CHAOS_PG_URL": PG_URL, "CHAOS_SCHEMA": pg_setup.schema}
    servers: list[RunqServer] = [None] * 3  # type: ignore[list-item]

    async def start(k: int) -> None:
        servers[k] = await pg_serve_factory(config, env=env)

    async with anyio.create_task_group() as tg:
        for k in range(3):
            tg.start_soon(start, k)

    produced = Produced()
    faults = Faults()
    started = time.monotonic()
    produce_took = [0.0]

    async def producer() -> None:
        await produce(servers, plan, produced)
        produce_took[0] = time.monotonic() - started

    async with anyio.create_task_group() as tg:
        tg.start_soon(producer)
        tg.start_soon(inject_faults, servers, plan, faults, pg_setup.schema)
    chaos_took = time.monotonic() - started
    for server in servers:
        await server.wait_ready()

    assert not produced.refused, f"submissions refused: {produced.refused[:5]}"
    assert not produced.gave_up, f"never acknowledged: {len(produced.gave_up)} submissions"
    assert len(produced.acked) == plan.runs
    assert faults.kills >= plan.chaos_seconds / plan.kill_every / 2, faults.events

    # Guarantee 1: every run reaches a final status, soon after the last fault.
    deadline = LOCK_GRACE + FINAL_MARGIN
    remaining = max(deadline - (time.monotonic() - faults.last_fault), 1.0)
    await wait_for(
        lambda: _none_left(pg_setup),
        timeout=remaining,
        interval=0.25,
        message=f"every run final within {deadline:g}s of the last fault",
    )
    final_after = time.monotonic() - faults.last_fault

    ev = await collect(pg_setup, list(produced.acked.values()))
    report = check(plan, produced, ev)
    fenced = count_log_events(servers, "run.write_fenced")
    leases_lost = count_log_events(servers, "lease.lost", "run.lease_lost")
    lines = [
        f"chaos ({'long' if plan is LONG else 'short'}): {plan.runs} runs, "
        f"{chaos_took:.1f}s of faults, 3 replicas, lock_grace_seconds={LOCK_GRACE:g}",
        f"  producer: all acknowledged after {produce_took[0]:.1f}s",
        f"  faults: {faults.kills} SIGKILL + restart, {faults.pauses} SIGSTOP/SIGCONT pauses",
        f"  submissions: {len(produced.acked)} acknowledged, rows in the table "
        f"{ev.row_count}, {produced.replayed} idempotent replays, "
        f"attempts by outcome {dict(produced.outcomes)}",
        f"  final {final_after:.1f}s after the last fault (allowed {deadline:g}s)",
        *(f"  {key}: {value}" for key, value in report.items()),
        f"  fenced-off writes discarded (logged): {fenced}; leases lost (logged): {leases_lost}",
    ]
    with capsys.disabled():
        print("\n" + "\n".join(lines))


async def _none_left(setup: RunqSetup) -> bool:
    return await unfinished_runs(setup) == 0


def check(plan: Plan, produced: Produced, ev: Evidence) -> dict[str, Any]:
    """Every assertion of the module docstring; returns the counts it saw."""
    by_index = produced.acked
    index_of = {run_id: i for i, run_id in by_index.items()}

    # Every acknowledged submission exists, once.
    missing = [i for i, run_id in by_index.items() if run_id not in ev.runs]
    assert not missing, f"acknowledged but missing: {missing[:10]}"
    assert len(set(by_index.values())) == plan.runs, "two keys answered with one run"
    assert ev.row_count == plan.runs, f"{ev.row_count} rows for {plan.runs} keys"
    not_final = [r.id for r in ev.runs.values() if r.status not in FINAL]
    assert not not_final, not_final[:10]
    assert not [r for r in ev.runs.values() if r.status is Status.CANCELLED]

    # Executions: never more than max_attempts, never the same attempt twice.
    per_run: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for run_id, attempt, pid in ev.executions:
        per_run[run_id].append((attempt, pid))
    unknown = set(per_run) - set(ev.runs)
    assert not unknown, f"executions of runs nobody submitted: {sorted(unknown)[:5]}"
    for run_id, executions in per_run.items():
        run = ev.runs[run_id]
        attempts = [a for a, _ in executions]
        i = index_of[run_id]
        assert len(attempts) == len(set(attempts)), f"{run_id}: an attempt ran twice {executions}"
        assert len(attempts) <= produced.max_attempts[i], f"{run_id}: {executions}"
        assert max(attempts) <= run.attempt <= run.max_attempts, (run_id, run.attempt, executions)
        if produced.max_attempts[i] == 1:
            assert len(attempts) <= 1, f"{run_id} (max_attempts 1) executed {executions}"

    # Completions: one per run, written by the attempt and the process holding the lease.
    completions = [a for a in ev.audit if a["new_status"] == "completed"]
    per_completion = Counter(a["run_id"] for a in completions)
    twice = [run_id for run_id, n in per_completion.items() if n > 1]
    assert not twice, f"runs completed twice: {twice[:5]}"
    for a in completions:
        run = ev.runs[a["run_id"]]
        assert run.status is Status.COMPLETED
        assert a["old_status"] == "running", dict(a)
        assert a["old_attempt"] == run.attempt, dict(a)
        answer = run.answer
        assert answer["attempt"] == run.attempt, (run.id, answer, run.attempt)
        holder_pid = ev.worker_pids.get(a["old_locked_by"])
        assert holder_pid == answer["pid"], (
            f"{run.id} completed by pid {answer['pid']} while {a['old_locked_by']} "
            f"(pid {holder_pid}) held the lease: a fenced-off write changed the row"
        )
        assert (run.attempt, answer["pid"]) in per_run[run.id], (run.id, per_run[run.id])
    completed = [r for r in ev.runs.values() if r.status is Status.COMPLETED]
    assert len(completed) == len(completions)

    # The state machine held under faults.
    for a in ev.audit:
        old, new = a["old_status"], a["new_status"]
        assert old not in ("completed", "failed", "cancelled"), f"left a final status: {dict(a)}"
        if old == "queued" and new == "running":
            assert a["new_attempt"] == a["old_attempt"] + 1, dict(a)
        else:
            assert a["new_attempt"] == a["old_attempt"], f"attempt changed outside a claim: {a}"

    # Non-idempotent sections: a death inside one is never retried.
    side_rows = Counter((r["run_id"], r["attempt"]) for r in ev.side)
    assert max(side_rows.values(), default=1) == 1, "one attempt wrote its side row twice"
    killed_inside = 0
    for row in ev.side:
        run = ev.runs[row["run_id"]]
        assert index_of[run.id] in produced.side
        if row["finished"] and run.status is Status.COMPLETED:
            continue
        if not row["finished"]:
            killed_inside += 1
            assert run.status is Status.FAILED, (run.id, run.status, dict(row))
            assert run.termination_reason is TerminationReason.NOT_RETRYABLE, run.id
            assert run.attempt == row["attempt"], f"{run.id} executed again after {dict(row)}"
    # Retries are not given up early: a run exhausted its attempts before it was dead-lettered.
    for run in ev.runs.values():
        if run.termination_reason is TerminationReason.RETRIES_EXHAUSTED:
            assert run.attempt >= run.max_attempts, (run.id, run.attempt, run.max_attempts)
    not_retryable = [
        r for r in ev.runs.values() if r.termination_reason is TerminationReason.NOT_RETRYABLE
    ]
    for run in not_retryable:
        assert index_of[run.id] in produced.side, f"{run.id} not_retryable: {run.error}"
        later = [a for a, _ in per_run.get(run.id, []) if a > run.attempt]
        assert not later, f"{run.id} executed after its dead letter"

    by_attempts = Counter(produced.max_attempts[index_of[r.id]] for r in completed)
    reasons = Counter(
        (r.termination_reason.value if r.termination_reason else "-")
        for r in ev.runs.values()
        if r.status is Status.FAILED
    )
    reexecuted = sum(1 for executions in per_run.values() if len(executions) > 1)
    return {
        "executions": len(ev.executions),
        "runs executed more than once (max_attempts >= 2 only)": reexecuted,
        "completed": f"{len(completed)} (by max_attempts: {dict(sorted(by_attempts.items()))})",
        "failed": dict(reasons),
        "reaper requeues (running -> queued)": sum(
            1 for a in ev.audit if (a["old_status"], a["new_status"]) == ("running", "queued")
        ),
        "non-idempotent executions / died inside the section": (
            f"{len(ev.side)} / {killed_inside}"
        ),
        "runs completed by two attempts": 0,
        "max_attempts=1 runs executed twice": 0,
        "runs executed more than max_attempts times": 0,
    }
