"""``runq serve``, ``runq work`` and the transports, against real daemons on both engines.

Each test starts real ``runq serve`` subprocesses (tests/serve_harness.py), submits through
a ``Queue`` in the test process (or the CLI, or a replica's HTTP API), and waits for
conditions with deadlines. Leases are short (``lock_grace_seconds = 3``: heartbeats every
second) so kill and drain scenarios settle in seconds.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest
from conftest import PG_URL
from helpers import ordered_run_id, wait_for
from serve_handlers import read_executions
from serve_harness import (  # fixtures are used by name
    RunqSetup,
    ServeFactory,
    api_available,
    pg_ready,
    pg_serve_factory,
    pg_setup,
    runq_engine,
    runq_setup,
    serve_factory,
)

from runq.model import Completion, FailOutcome, Lease, NewRun, Run, Status, TerminationReason

#: anyio must see its marker at collection, or it re-parametrises away the engine.
pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

#: Fixtures imported by name (not unused imports).
__all__ = [
    "pg_ready",
    "pg_serve_factory",
    "pg_setup",
    "runq_engine",
    "runq_setup",
    "serve_factory",
]

FAST = {"poll_interval": 0.2, "lock_grace_seconds": 3, "stop_timeout_seconds": 1}


def wake_route(setup: RunqSetup) -> dict[str, str]:
    """The non-sync transport of the engine: postgres NOTIFY, else the in-process wake-up."""
    return {"*": "postgres" if setup.engine == "postgres" else "local"}


async def get_run(setup_queue: Any, run_id: str) -> Run:
    run = await setup_queue.get(run_id)
    assert run is not None, f"run {run_id} vanished"
    return run


async def wait_status(
    q: Any,
    run_id: str,
    statuses: set[Status],
    *,
    timeout: float = 15.0,  # noqa: ASYNC109 - the deadline given to wait_for
) -> Run:
    async def reached() -> Run | None:
        run = await get_run(q, run_id)
        return run if run.status in statuses else None

    run: Run = await wait_for(
        reached, timeout=timeout, message=f"run {run_id} reaches {sorted(statuses)}"
    )
    return run


async def submit(q: Any, component: str, payload: Any = None, **options: Any) -> Run:
    ctype, cid = component.split("/")
    result = await q.defer(ctype, cid, payload, **options)
    run: Run = result.run
    return run


# -- execution through the daemon ------------------------------------------------------------


async def test_deferred_run_is_executed_and_its_answer_stored(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    server = await serve_factory({"queue": FAST, "routing": wake_route(runq_setup)})
    async with runq_setup.queue() as q:
        run = await submit(q, "task/echo", {"hello": "world"})
        done = await wait_status(q, run.id, {Status.COMPLETED}, timeout=10)
        assert done.answer == {"hello": "world"}
        assert done.attempt == 1
        assert done.termination_reason is TerminationReason.COMPLETED

        # A run for a component this daemon does not know fails for good; the daemon goes on.
        unknown = await q.store.submit(
            NewRun(component_type="task", component_id="nope"), max_queue_depth=0
        )
        failed = await wait_status(q, unknown.run.id, {Status.FAILED})
        assert failed.termination_reason is TerminationReason.NOT_RETRYABLE
        assert failed.error == "unknown component task/nope"
        after = await submit(q, "task/echo", 2)
        assert (await wait_status(q, after.id, {Status.COMPLETED})).answer == 2
    assert server.returncode is None


async def test_work_sweeps_exactly_the_oldest_runs_and_exits_zero_when_one_fails(
    runq_setup: RunqSetup,
) -> None:
    async with runq_setup.queue() as q:
        ids = []
        for i in range(7):
            new = q.new_run("task", "fail" if i == 2 else "echo", {"message": "boom", "i": i})
            new.id = ordered_run_id()  # runs submitted within one millisecond stay in order
            ids.append((await q.submit(new))[0].run.id)
        result = await runq_setup.cli("work", "--limit", "5", "--time-limit", "30")
        assert result.returncode == 0, result.stderr
        runs = [await get_run(q, run_id) for run_id in ids]
    statuses = [r.status for r in runs]
    assert statuses[:5] == [Status.COMPLETED] * 2 + [Status.FAILED] + [Status.COMPLETED] * 2
    assert statuses[5:] == [Status.QUEUED, Status.QUEUED]
    assert runs[2].error == "boom"
    assert "claimed 5 run(s)" in result.stdout


async def test_work_exits_non_zero_when_the_queue_cannot_be_read(tmp_path: Path) -> None:
    setup = RunqSetup("sqlite", tmp_path)
    setup.store_url = "postgresql://postgres@127.0.0.1:1/nothing"  # nobody listens there
    result = await setup.cli("work", "--limit", "5")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr


async def test_enqueue_on_sync_executes_in_the_caller_and_defer_waits_for_a_sweep(
    runq_setup: RunqSetup,
) -> None:
    async with runq_setup.queue() as q:  # no [routing]: every component uses sync
        assert q.route("task", "echo") == "sync"
        ran = await q.enqueue("task", "echo", {"n": 1})
        assert ran.status is Status.COMPLETED
        assert ran.answer == {"n": 1}

        deferred = await submit(q, "task/echo", {"n": 2})
        assert (await get_run(q, deferred.id)).status is Status.QUEUED

        failing = await q.enqueue("task", "fail", {"message": "no"}, max_attempts=2)
        # The retry of a sync-routed run is never executed inside the failure handling.
        assert failing.status is Status.QUEUED
        assert failing.attempt == 1

        cli = await runq_setup.cli("enqueue", "task/echo", "--payload", '{"n": 3}')
        assert cli.returncode == 0, cli.stderr
        printed = msgspec.json.decode(cli.stdout)
        assert printed["status"] == "completed"
        assert printed["answer"] == {"n": 3}

        sweep = await runq_setup.cli("work")
        assert sweep.returncode == 0, sweep.stderr
        assert (await get_run(q, deferred.id)).answer == {"n": 2}


async def test_unknown_handler_module_stops_the_start_naming_the_key(
    runq_setup: RunqSetup,
) -> None:
    config = runq_setup.write_config({"components": {"task/x": "no_such_module:handler"}})
    result = await runq_setup.cli("serve", config=config)
    assert result.returncode == 2
    assert 'components."task/x"' in result.stderr
    assert "Traceback" not in result.stderr


# -- leases: plain functions, SIGKILL, SIGTERM -------------------------------------------------


async def test_a_blocking_plain_function_keeps_its_lease(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    await serve_factory({"queue": FAST, "routing": wake_route(runq_setup)})
    async with runq_setup.queue() as q:
        run = await submit(q, "task/block", {"seconds": 4.5})  # longer than lock_grace (3 s)
        done = await wait_status(q, run.id, {Status.COMPLETED, Status.FAILED}, timeout=15)
    assert done.status is Status.COMPLETED, done.error
    assert done.attempt == 1
    assert done.answer["slept"] == 4.5


async def test_sigkill_mid_run_the_survivor_reaps_fails_or_reexecutes(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    config = {"queue": FAST, "routing": wake_route(runq_setup)}
    doomed = await serve_factory(config)
    async with runq_setup.queue() as q:
        once = await submit(q, "task/record", {"first_seconds": 60}, max_attempts=1)
        twice = await submit(q, "task/record", {"first_seconds": 60}, max_attempts=2)
        running = [await wait_status(q, r.id, {Status.RUNNING}) for r in (once, twice)]
        dead_worker = running[0].locked_by
        assert dead_worker is not None
        await serve_factory(config)  # the survivor: both runs are taken, it claims nothing
        doomed.kill()

        failed = await wait_status(q, once.id, {Status.FAILED}, timeout=20)
        assert failed.termination_reason is TerminationReason.RETRIES_EXHAUSTED
        assert "runq jobs requeue" in (failed.error or "")
        redone = await wait_status(q, twice.id, {Status.COMPLETED}, timeout=20)
        assert redone.attempt == 2

        # The killed attempt can no longer write anything.
        fenced = await q.store.complete_many(
            dead_worker, [Completion(run_id=twice.id, attempt=1, answer="late")]
        )
        assert twice.id in fenced.fenced_off
        beat = await q.store.heartbeat_many(dead_worker, [Lease(twice.id, 1)])
        assert beat.lost == (Lease(twice.id, 1),)
        outcome = await q.store.fail(
            dead_worker, Lease(once.id, 1), error="late", retryable=True, retry_in_seconds=0
        )
        assert outcome is FailOutcome.FENCED_OFF
        assert (await get_run(q, twice.id)).answer["echo"] == {"first_seconds": 60}
    by_run = Counter(run_id for run_id, _, _ in read_executions(runq_setup.workdir))
    assert by_run == {once.id: 1, twice.id: 2}


async def test_sigterm_drains_requeues_or_fails_stragglers_and_leaves_queued_runs(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    server = await serve_factory(
        {
            "queue": {**FAST, "lock_grace_seconds": 6, "stop_timeout_seconds": 2},
            "routing": wake_route(runq_setup),
        },
        env={"WATCHDOG_USEC": "200000"},
    )
    async with runq_setup.queue() as q:
        quick = await submit(q, "task/sleep", {"seconds": 0.5})  # ends within the drain
        retried = await submit(q, "task/sleep", {"seconds": 60}, max_attempts=2)
        exhausted = await submit(q, "task/sleep", {"seconds": 60}, max_attempts=1)
        for run in (quick, retried, exhausted):
            await wait_status(q, run.id, {Status.RUNNING})
        later = await submit(q, "task/echo", 1, delay_seconds=3600)

        started = time.monotonic()
        assert await server.terminate() == 0
        # stop_timeout_seconds (2 s) for in-flight runs, then the stragglers are cancelled.
        assert time.monotonic() - started < 7

        assert (await get_run(q, quick.id)).status is Status.COMPLETED
        requeued = await get_run(q, retried.id)
        assert (requeued.status, requeued.attempt) == (Status.QUEUED, 1)
        assert requeued.error == "interrupted by worker shutdown"
        failed = await get_run(q, exhausted.id)
        assert failed.status is Status.FAILED
        assert failed.error == "interrupted by worker shutdown"
        assert failed.termination_reason is TerminationReason.RETRIES_EXHAUSTED
        untouched = await get_run(q, later.id)
        assert (untouched.status, untouched.attempt) == (Status.QUEUED, 0)
        assert await q.store.list_workers(max_age_seconds=3600) == []
    notes = server.drain_notifications()
    assert "READY=1" in notes
    assert "STOPPING=1" in notes
    assert "WATCHDOG=1" in notes


async def test_a_second_signal_stops_at_once(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    server = await serve_factory(
        {"queue": {**FAST, "lock_grace_seconds": 30, "stop_timeout_seconds": 20}}
    )
    async with runq_setup.queue() as q:
        run = await submit(q, "task/sleep", {"seconds": 60})
        await wait_status(q, run.id, {Status.RUNNING}, timeout=10)
        server.send(signal.SIGTERM)
        await wait_for(
            lambda: "STOPPING=1" in server.drain_notifications(), timeout=10, message="drain starts"
        )
        started = time.monotonic()
        server.send(signal.SIGTERM)
        assert await server.wait_exit(timeout=10) != 0
        assert time.monotonic() - started < 3
        # Nothing settled it: the lease stays until a reaper finds it stale.
        assert (await get_run(q, run.id)).status is Status.RUNNING


# -- PostgreSQL: replicas, cross-replica cancel, reconnect ----------------------------------------


@pytest.mark.postgres
async def test_two_replicas_share_2000_runs_exactly_once_and_cancel_across_them(
    pg_setup: RunqSetup, pg_serve_factory: ServeFactory
) -> None:
    queue = {"poll_interval": 0.5, "lock_grace_seconds": 30, "max_concurrency": 32}
    routing = {"*": "postgres"}
    first = await pg_serve_factory({"queue": queue, "routing": routing})
    second = await pg_serve_factory({"queue": {**queue, "deployment_id": "b"}, "routing": routing})
    async with pg_setup.queue({"routing": routing}) as q:
        news = [
            NewRun(component_type="task", component_id="record", payload={"i": i})
            for i in range(2000)
        ]
        ids = await q.store.submit_many(news)
        await q.store.notifications().send("wake")

        async def all_completed() -> bool:
            counts = (await q.store.stats()).counts
            return counts.get("completed", 0) == 2000

        await wait_for(all_completed, timeout=90, interval=0.25, message="2000 runs complete")
        executions = read_executions(pg_setup.workdir)
        per_run = Counter(run_id for run_id, _, _ in executions)
        assert set(per_run) == set(ids)
        assert max(per_run.values()) == 1, "a run executed twice"
        pids = Counter(pid for _, _, pid in executions)
        assert set(pids) == {first.pid, second.pid}, f"not shared: {pids}"

        # A run only the second replica may claim (deployment affinity), cancelled through
        # the first: the cancel travels over NOTIFY (heartbeats are 10 s apart here).
        pinned = await submit(q, "task/slow", {"seconds": 60}, deployment_id="b")
        running = await wait_status(q, pinned.id, {Status.RUNNING}, timeout=10)
        assert running.locked_by is not None
        started = time.monotonic()
        if api_available():
            response = await first.request("POST", f"/runs/{pinned.id}/cancel")
            assert response.status_code == 200, response.text
        else:
            result = await pg_setup.cli("jobs", "cancel", pinned.id, config=first.config_path)
            assert result.returncode == 0, result.stderr
        issued = time.monotonic()
        cancelled = await wait_status(q, pinned.id, {Status.CANCELLED}, timeout=1.0)
        assert cancelled.termination_reason is TerminationReason.CANCELLED
        assert time.monotonic() - issued < 1.0, f"cancel took {time.monotonic() - started:.2f}s"


async def _terminate_sessions(ports: list[int]) -> int:
    conn = await asyncpg.connect(PG_URL)
    try:
        rows = await conn.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE client_port = ANY($1::int[])",
            ports,
        )
    finally:
        await conn.close()
    return len(rows)


@pytest.mark.postgres
async def test_the_daemon_survives_a_postgres_restart_and_listens_again(
    pg_setup: RunqSetup, pg_serve_factory: ServeFactory
) -> None:
    # A long poll: a run executed within a second was woken by NOTIFY, not found by the poll.
    routing = {"*": "postgres"}
    server = await pg_serve_factory(
        {"queue": {"poll_interval": 30, "lock_grace_seconds": 6}, "routing": routing}
    )
    async with pg_setup.queue({"routing": routing}) as q:
        before = await submit(q, "task/echo", "before")
        await wait_status(q, before.id, {Status.COMPLETED}, timeout=5)

        # What a server restart does to this daemon: every session of it is terminated.
        ports = server.postgres_client_ports()
        assert ports, "the daemon holds no PostgreSQL connection"
        assert await _terminate_sessions(ports) >= 1
        await wait_for(
            lambda: "listener.reconnected" in server.logs(), timeout=15, message="LISTEN again"
        )
        started = time.monotonic()
        after = await submit(q, "task/echo", "after")
        done = await wait_status(q, after.id, {Status.COMPLETED}, timeout=10)
        assert done.answer == "after"
        assert time.monotonic() - started < 5, "woken by the poll, not by NOTIFY"
    assert server.returncode is None
    assert await server.terminate() == 0  # and it still drains cleanly


async def test_a_lost_lease_stops_its_execution_which_writes_nothing(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    server = await serve_factory({"queue": FAST, "routing": wake_route(runq_setup)})
    async with runq_setup.queue() as q:
        run = await submit(q, "task/record", {"first_seconds": 60}, max_attempts=2)
        await wait_status(q, run.id, {Status.RUNNING})
        # A peer whose view of time is ahead judges the lease stale and requeues the run
        # (for later: available_at is that peer's "now").
        q.store.clock_offset_seconds = 100
        report = await q.store.reap_stale(lock_grace_seconds=3, limit=10)
        q.store.clock_offset_seconds = 0
        assert report.requeued == 1
        await wait_for(
            lambda: '"run.lease_lost"' in server.logs(), timeout=5, message="the execution stops"
        )
        after = await get_run(q, run.id)
    assert (after.status, after.attempt, after.answer) == (Status.QUEUED, 1, None)
    assert len(read_executions(runq_setup.workdir)) == 1
    if api_available():
        metrics = (await server.request("GET", "/metrics")).text
        assert "runq_leases_lost_total 1.0" in metrics


async def test_an_api_only_replica_claims_nothing_and_registers_no_worker(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    server = await serve_factory({"queue": {**FAST, "worker": False}})
    async with runq_setup.queue() as q:
        assert await q.store.list_workers(max_age_seconds=3600) == []
    assert "READY=1" in server.drain_notifications()
    assert await server.terminate() == 0
    assert "STOPPING=1" in server.drain_notifications()
