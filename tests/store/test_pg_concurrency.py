"""Several OS processes claim from one Postgres table at once: every run is claimed exactly
once per attempt (FOR UPDATE SKIP LOCKED under real contention, not just inside one loop).

Each process has its own ``PostgresStore`` on the same schema, claims 8 at a time and
completes what it claimed; every fifth run fails its first attempt with an immediate retry,
so second attempts are claimed under contention too. Each process writes the
``(run_id, attempt)`` pairs it claimed to a file; the test checks none is duplicated and
none is missing.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import PG_URL, TEST_KEY, drop_schema, new_schema_name, require_postgres

from runq.listing import RunFilter
from runq.model import Completion, FailOutcome, NewRun, Status
from runq.seal import KeyRing
from runq.store import make_store

pytestmark = pytest.mark.postgres

RUNS = 2000
PROCESSES = 4
SLOTS = 8
FAIL_FIRST_EVERY = 5


async def _claim_until_drained(
    url: str, schema: str, worker: str, barrier: Any
) -> dict[str, list[Any]]:
    store = make_store(url, schema=schema, sealer=KeyRing([TEST_KEY]))
    await store.connect()
    claims: list[tuple[str, int]] = []
    fenced: list[str] = []
    try:
        barrier.wait(60)  # everyone connected: start claiming together
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            runs = await store.claim(worker, SLOTS, deployment_id=None)
            if not runs:
                counts = (await store.stats()).counts
                if not counts.get("queued", 0) and not counts.get("running", 0):
                    break
                # Others still hold runs that may come back as retries: poll again soon.
                await asyncio.sleep(0.005)
                continue
            completions = []
            for run in runs:
                claims.append((run.id, run.attempt))
                if run.payload["fail_first"] and run.attempt == 1:
                    outcome = await store.fail(
                        worker, run.lease, error="first", retryable=True, retry_in_seconds=0
                    )
                    if outcome is not FailOutcome.RETRY_SCHEDULED:
                        fenced.append(run.id)
                else:
                    completions.append(Completion(run_id=run.id, attempt=run.attempt))
            result = await store.complete_many(worker, completions)
            fenced.extend(result.fenced_off)
    finally:
        await store.close()
    return {"claims": claims, "fenced": fenced}


def _claimer_process(url: str, schema: str, worker: str, barrier: Any, out_path: str) -> None:
    result = asyncio.run(_claim_until_drained(url, schema, worker, barrier))
    Path(out_path).write_text(json.dumps(result))


async def _prepare(schema: str) -> dict[str, bool]:
    store = make_store(PG_URL, schema=schema, sealer=KeyRing([TEST_KEY]))
    await store.connect()
    try:
        await store.migrate()
        news = [
            NewRun(
                component_type="task",
                component_id="echo",
                payload={"i": i, "fail_first": i % FAIL_FIRST_EVERY == 0},
                max_attempts=2,
            )
            for i in range(RUNS)
        ]
        ids = await store.submit_many(news)
        return {rid: bool(new.payload["fail_first"]) for rid, new in zip(ids, news, strict=True)}
    finally:
        await store.close()


async def _final_counts(schema: str) -> dict[str, int]:
    store = make_store(PG_URL, schema=schema, sealer=KeyRing([TEST_KEY]))
    await store.connect()
    try:
        page = await store.list_jobs(where=RunFilter(statuses=(Status.COMPLETED,)), limit=1)
        stats = await store.stats()
        assert page.total_count == stats.counts.get("completed", 0)
        return {k: v for k, v in stats.counts.items() if v}
    finally:
        await store.close()


@pytest.mark.timeout(300)
def test_processes_claim_every_run_exactly_once_per_attempt(tmp_path: Path) -> None:
    require_postgres()
    schema = new_schema_name()
    try:
        fail_first = asyncio.run(_prepare(schema))
        ctx = multiprocessing.get_context("spawn")
        barrier = ctx.Barrier(PROCESSES)
        outs = [tmp_path / f"claims-{i}.json" for i in range(PROCESSES)]
        procs = [
            ctx.Process(
                target=_claimer_process,
                args=(PG_URL, schema, f"proc-{i}", barrier, str(outs[i])),
                name=f"claimer-{i}",
            )
            for i in range(PROCESSES)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(240)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
        assert [p.exitcode for p in procs] == [0] * PROCESSES, "a claimer process failed"

        per_process = [json.loads(out.read_text()) for out in outs]
        claims = [tuple(c) for result in per_process for c in result["claims"]]
        fenced = [rid for result in per_process for rid in result["fenced"]]
        duplicates = [pair for pair, n in Counter(claims).items() if n > 1]
        assert duplicates == [], f"claimed more than once: {duplicates[:5]}"
        assert fenced == [], f"a process lost runs it had just claimed: {fenced[:5]}"

        attempts: dict[str, list[int]] = {}
        for rid, attempt in claims:
            attempts.setdefault(rid, []).append(attempt)
        assert set(attempts) == set(fail_first), "some runs were never claimed"
        for rid, seen in attempts.items():
            expected = [1, 2] if fail_first[rid] else [1]
            assert sorted(seen) == expected, f"{rid}: attempts {seen}, expected {expected}"
        assert len(claims) == RUNS + sum(fail_first.values())
        busy = [len(result["claims"]) for result in per_process]
        assert sum(1 for n in busy if n) >= 2, f"no contention: claims per process {busy}"

        assert asyncio.run(_final_counts(schema)) == {"completed": RUNS}
    finally:
        asyncio.run(drop_schema(schema))
        for out in tmp_path.glob("claims-*.json"):
            os.unlink(out)
