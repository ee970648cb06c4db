"""The failover drill: a PostgreSQL primary dies under load and its streaming standby takes
over, with two ``runq serve`` replicas on the cluster's multi-host URL.

The cluster is private (``pg_clusters``): a primary and a standby built with
``pg_basebackup -R``. Two replicas run with ``[store] url`` naming both servers
(``target_session_attrs=read-write``), ``poll_interval`` 30 s (so a wake-up within a
second came through ``NOTIFY``), and a handler that appends each execution to an fsynced
ledger. A producer offers a steady rate over HTTP (``drill.Producer``). Then, as an
orchestrator would: SIGKILL of the primary's postmaster, a second to notice, ``pg_ctl
promote`` of the standby; later the old primary is rewound and rejoins as a standby of
the new one (with synchronous replication, it is named the synchronous standby again).

With synchronous replication the drill asserts: no acknowledged run lost, no run
(``max_attempts = 1``) executed twice, every run final, the fleet back to 95 % of the
offered rate within 10 s of the promotion, each replica's log and
``runq_store_failovers_total`` saying it moved, ``/readyz`` naming the new primary, and
each replica's listener subscribed on the new primary (with the other replica stopped, a
run submitted from elsewhere is claimed at once, although nobody polls for 30 s). With
asynchronous replication it asserts the same recovery and measures what was lost and
repeated. Every number is printed.

Known gap, reported rather than hidden: a claim commits without waiting for its WAL, so a
run claimed just before the kill can be missing from the standby and execute a second
time at the same attempt, synchronous replication or not. Such repeats (and only those:
any other repeat fails) make the synchronous variant an expected failure (xfail, with the
count) until a run's start is written synchronously before its handler is called; then
the branch never runs and the variant passes.

``exclusive``: the time back to the offered rate is a latency bound that tests running
beside the drill on two cores would distort.
"""

from __future__ import annotations

import itertools
import math
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from helpers import wait_for
from pgcluster import PgCluster, PgClusterFactory, multi_host_url
from serve_handlers import read_ledger
from serve_harness import RunqServer, RunqSetup, database_for, servers_on

from reliability.drill import Producer, first_window_at_rate, lowest_rate
from runq.model import Status

pytestmark = [pytest.mark.anyio, pytest.mark.daemon, pytest.mark.postgres, pytest.mark.exclusive]

RATE = float(os.environ.get("RUNQ_DRILL_RATE", "100"))
HANDLER_SECONDS = 0.02
POLL = 30.0
#: How long the orchestrator takes to notice the dead primary and promote the standby.
DETECTION_SECONDS = 1.0
#: The promise under test: back to 95 % of the offered rate within this long of the
#: promotion (asserted with a margin for a shared two-core machine, and printed).
RECOVERY_SECONDS = 10.0
CONFIG = {
    "queue": {
        "poll_interval": POLL,
        "lock_grace_seconds": 10,
        "stop_timeout_seconds": 2,
        "max_concurrency": 16,
        "max_queue_depth": 0,
    },
    "routing": {"*": "postgres"},
}
FINAL = ("completed", "failed", "cancelled")


@dataclass
class Marks:
    killed: float = 0.0
    promoted: float = 0.0
    rejoined: float = 0.0
    stopped: float = 0.0


@pytest.mark.parametrize("replication", ["synchronous", "asynchronous"])
async def test_a_fleet_rides_out_a_failover(
    replication: str,
    pg_clusters: PgClusterFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    began = time.monotonic()
    primary = await pg_clusters.start("pg_a")
    standby = await primary.add_standby("pg_b")
    synchronous = replication == "synchronous"
    if synchronous:
        await primary.set_synchronous(standby)
        await primary.wait_streaming(standby, sync=True)
    url = multi_host_url(primary, standby)
    async with (
        database_for("postgres", tmp_path, store_url=url) as setup,
        servers_on(setup) as start,
    ):
        servers = [await start(CONFIG), await start(CONFIG)]
        producer = Producer(servers, RATE, HANDLER_SECONDS)
        marks = Marks()
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(producer.run, stop)
            await wait_for(
                lambda: len(producer.acked) >= RATE * 4,
                timeout=60,
                message="the load runs",
            )
            await fail_over(primary, standby, marks)
            await wait_for(
                lambda: recovered(setup, marks),
                timeout=60,
                interval=0.5,
                message="the fleet is back to 95 % of the offered rate",
            )
            # Later the old primary comes back, as a standby of the new one.
            await standby.set_asynchronous()  # nothing to wait for until it streams
            await primary.rejoin(standby)
            if synchronous:
                await standby.set_synchronous(primary)
                await standby.wait_streaming(primary, sync=True)
            marks.rejoined = time.time()
            await wait_for(
                lambda: producer.acked_since(marks.rejoined) >= RATE * 2,
                timeout=60,
                message="submissions go on after the old primary rejoined",
            )
            marks.stopped = time.time()
            stop.set()

        exited = {s.name: s.returncode for s in servers if s.returncode is not None}
        assert not exited, f"replicas exited: {exited}"
        result = await collect(setup, standby, producer, marks)
        await wait_for(
            lambda: all_final(standby, setup),
            timeout=60,
            interval=0.5,
            message="every run final",
        )
        woken = await listeners_resubscribed(setup, servers)
        moved = [await moves(server, standby) for server in servers]
        result.give_backs_failed = sum(s.logs().count('"claim.give_back_failed"') for s in servers)

    result.report(replication, woken, moved, time.monotonic() - began, capsys)
    assert not producer.unexpected, producer.unexpected[:5]
    assert set(producer.statuses) <= {"202", "503"}, producer.statuses
    assert result.back_seconds is not None, "the fleet never came back to the offered rate"
    # A generous bound on a shared machine; the measured value is printed above.
    assert result.back_seconds <= RECOVERY_SECONDS * 1.5, result.back_seconds
    assert all(latency < 5 for latency in woken.values()), woken
    for server, (failovers, ready_on, logged) in zip(servers, moved, strict=True):
        assert failovers == 1, f"{server.name}: runq_store_failovers_total = {failovers}"
        assert ready_on == standby.address, f"{server.name}: /readyz names {ready_on}"
        assert logged, f"{server.name} logged no store.primary_changed"
    if synchronous:
        assert not result.lost, f"acknowledged and lost: {result.lost[:5]}"
        unexplained = [r for r in result.twice if r not in result.claims_lost]
        assert not unexplained, f"max_attempts = 1 and executed twice: {unexplained[:5]}"
        # A give-back whose answer was lost would repeat an attempt too: rule it out.
        assert not (result.claims_lost and result.give_backs_failed), result.give_backs_failed
        if result.claims_lost:
            # Known, and someone else's to fix: a claim commits without waiting for its
            # WAL (docs/design.md, "Claims commit without waiting"), so a claim made just
            # before the primary died may never reach the standby; the promoted standby
            # has the run queued at the same attempt and it executes again. Once a run's
            # start is written synchronously before its handler is called, this no longer
            # happens and the drill passes without this branch.
            pytest.xfail(
                f"{len(result.claims_lost)} run(s) executed twice at the same attempt: "
                "their claim was lost in the failover (claims commit asynchronously)"
            )


async def fail_over(primary: PgCluster, standby: PgCluster, marks: Marks) -> None:
    """SIGKILL of the primary's postmaster; the orchestrator notices and promotes."""
    marks.killed = time.time()
    await primary.kill()
    # The fault itself: how long an orchestrator takes to notice (not a wait for a result).
    await anyio.sleep(max(marks.killed + DETECTION_SECONDS - time.time(), 0))
    await standby.promote()
    marks.promoted = time.time()


def recovered(setup: RunqSetup, marks: Marks) -> bool:
    times = [at for *_, at in read_ledger(setup.workdir)]
    return first_window_at_rate(times, marks.promoted, RATE) is not None


async def all_final(cluster: PgCluster, setup: RunqSetup) -> bool:
    left = await cluster.fetchval(
        f"SELECT count(*) FROM {setup.schema}.runs WHERE status NOT IN {FINAL!r}"
    )
    return left == 0


@dataclass
class Result:
    acked: int
    offered: int
    lost: list[str]
    twice: list[str]
    #: Runs executed more than once, every time at the same attempt: a claim's attempt is
    #: counted again only when that claim is gone, so the first claim never reached the
    #: standby (a server process whose postmaster was killed may even commit for a moment).
    claims_lost: list[str]
    executions: int
    #: Runs executed that no 202 acknowledged and the new primary does not have: a
    #: submission the old primary committed (and a claim ran) but could not acknowledge
    #: before it died; the client's retry, same idempotency key, made a new run.
    unacknowledged_executed: list[str]
    #: Executions per second in the 3 s before the kill.
    baseline: float
    back_seconds: float | None
    acks_back_seconds: float | None
    #: From the promotion to the first acknowledgement and the first execution after it.
    first_ack: float
    first_execution: float
    lowest_after_back: float
    outage_seconds: float
    statuses: Counter[str]
    #: Executions per second from 2 s before the kill to the end of the load.
    timeline: list[int]
    #: Each run executed twice: (attempt, seconds from the promotion, pid) per execution.
    twice_detail: dict[str, list[tuple[int, float, int]]]
    #: ``claim.give_back_failed`` lines in the replicas' logs.
    give_backs_failed: int = 0

    def report(
        self,
        replication: str,
        woken: dict[str, float],
        moved: list[tuple[int, str, bool]],
        seconds: float,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        back = "never" if self.back_seconds is None else f"{self.back_seconds:.1f}s"
        acks_back = "never" if self.acks_back_seconds is None else f"{self.acks_back_seconds:.1f}s"
        lines = [
            f"failover drill ({replication} replication, {RATE:g} runs/s offered, "
            f"{seconds:.0f}s in all):",
            f"  acknowledged {self.acked} of {self.offered} offered; lost {len(self.lost)}; "
            f"executed twice {len(self.twice)} (of which a claim lost in the failover: "
            f"{len(self.claims_lost)}); executions {self.executions}",
            f"  executed, never acknowledged and gone from the new primary: "
            f"{len(self.unacknowledged_executed)}",
            f"  executions before the kill: {self.baseline:.0f}/s",
            f"  executions back to 95 % of the offered rate {back} after the promotion "
            f"(acknowledgements: {acks_back}); lowest 1 s rate after that "
            f"{self.lowest_after_back:.0f}/s",
            f"  first acknowledgement {self.first_ack * 1000:.0f} ms and first execution "
            f"{self.first_execution * 1000:.0f} ms after the promotion",
            f"  no acknowledgement for {self.outage_seconds:.1f}s around the failover; "
            f"answers {dict(self.statuses)}",
            "  NOTIFY after the failover, claimed in: "
            + ", ".join(f"{name} {latency:.2f}s" for name, latency in woken.items())
            + f" (poll_interval {POLL:g}s)",
            "  per replica (failovers, /readyz database, logged): " + str(moved),
            f"  executions per second from 2 s before the kill: {self.timeline}",
            *(f"  executed twice: {run_id} {runs}" for run_id, runs in self.twice_detail.items()),
            f"  give-backs of runs claimed ahead that failed: {self.give_backs_failed}",
        ]
        with capsys.disabled():
            print("\n" + "\n".join(lines))


async def collect(
    setup: RunqSetup, new_primary: PgCluster, producer: Producer, marks: Marks
) -> Result:
    acked = {ack.run_id for ack in producer.acked.values()}
    rows = await new_primary.fetch(f"SELECT id FROM {setup.schema}.runs")
    stored = {r["id"] for r in rows}
    ledger = read_ledger(setup.workdir)
    seen: dict[str, list[tuple[int, float]]] = {}
    pids: dict[str, list[int]] = {}
    for run_id, attempt, pid, at in ledger:
        seen.setdefault(run_id, []).append((attempt, at))
        pids.setdefault(run_id, []).append(pid)
    twice = {run_id: runs for run_id, runs in seen.items() if len(runs) > 1}
    times = [at for *_, at in ledger]
    ack_times = sorted(ack.at for ack in producer.acked.values())
    back = first_window_at_rate(times, marks.promoted, RATE)
    gaps = [b - a for a, b in itertools.pairwise(ack_times) if a >= marks.killed - 5]
    return Result(
        acked=len(acked),
        offered=producer.offered,
        lost=sorted(acked - stored),
        twice=sorted(twice),
        unacknowledged_executed=sorted(set(seen) - acked - stored),
        claims_lost=sorted(
            run_id for run_id, runs in twice.items() if len({attempt for attempt, _ in runs}) == 1
        ),
        baseline=sum(1 for t in times if marks.killed - 3 <= t < marks.killed) / 3,
        executions=len(ledger),
        back_seconds=back,
        acks_back_seconds=first_window_at_rate(ack_times, marks.promoted, RATE),
        first_ack=min((t for t in ack_times if t >= marks.promoted), default=math.inf)
        - marks.promoted,
        first_execution=min((t for t in times if t >= marks.promoted), default=math.inf)
        - marks.promoted,
        lowest_after_back=(
            lowest_rate(times, marks.promoted + back + 1, marks.stopped)
            if back is not None
            else 0.0
        ),
        outage_seconds=max(gaps, default=0.0),
        statuses=producer.statuses,
        twice_detail={
            run_id: [
                (attempt, round(at - marks.promoted, 3), pid)
                for (attempt, at), pid in zip(runs, pids[run_id], strict=True)
            ]
            for run_id, runs in twice.items()
        },
        timeline=[
            sum(1 for t in times if second <= t < second + 1)
            for second in range(int(marks.killed) - 2, int(marks.stopped) + 1)
        ],
    )


async def listeners_resubscribed(setup: RunqSetup, servers: list[RunqServer]) -> dict[str, float]:
    """Each replica alone (the other stopped with SIGSTOP) claims a run submitted from this
    process within seconds: only its LISTEN on the new primary explains that, since
    nobody polls for ``POLL`` seconds."""
    woken: dict[str, float] = {}
    async with setup.queue({"routing": {"*": "postgres"}}) as q:
        for awake in servers:
            asleep = [s for s in servers if s is not awake]
            for s in asleep:
                os.kill(s.pid, signal.SIGSTOP)
            try:
                sent = time.monotonic()
                run = (await q.defer("task", "ledger", {"probe": awake.name})).run

                async def done(run_id: str = run.id) -> bool:
                    found = await q.get(run_id)
                    return found is not None and found.status is Status.COMPLETED

                await wait_for(done, timeout=POLL / 2, message=f"{awake.name} woken by NOTIFY")
                woken[awake.name] = time.monotonic() - sent
                executed_by = {
                    pid for rid, _, pid, _ in read_ledger(setup.workdir) if rid == run.id
                }
                assert executed_by == {awake.pid}, (awake.name, executed_by)
            finally:
                for s in asleep:
                    os.kill(s.pid, signal.SIGCONT)
    return woken


async def moves(server: RunqServer, new_primary: PgCluster) -> tuple[int, str, bool]:
    """What the replica says about the failover: its counter, /readyz, its log."""
    metrics = (await server.request("GET", "/metrics")).text
    failovers = next(
        int(float(line.split()[-1]))
        for line in metrics.splitlines()
        if line.startswith("runq_store_failovers_total ")
    )
    ready = (await server.request("GET", "/readyz")).json()
    return failovers, ready.get("database", ""), '"store.primary_changed"' in server.logs()
