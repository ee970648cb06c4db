"""`runq keys rotate` over thousands of runs, killed half-way and resumed, on both engines."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
from conftest import PG_URL
from helpers import wait_for
from serve_harness import RunqSetup, runq_engine, runq_setup, write_toml

from runq.errors import SealError
from runq.ids import new_run_id
from runq.maintenance.rotation import KeyRotation, RotationReport
from runq.model import NewRun
from runq.seal import decode_key, generate_key, key_id_of
from runq.store import make_store, sealer_for
from runq.store.base import Store

pytestmark = [pytest.mark.anyio]
__all__ = ["runq_engine", "runq_setup"]  # fixtures used by name

RUNS = 4000


async def count_under_key(setup: RunqSetup, key_id: bytes) -> int:
    """Sealed payloads whose header names ``key_id`` (bytes 4 to 11 after the b"rq1" magic)."""
    if setup.engine == "postgres":
        conn = await asyncpg.connect(PG_URL)
        try:
            return int(
                await conn.fetchval(
                    f"SELECT count(*) FROM {setup.schema}.runs "
                    "WHERE substring(payload from 4 for 8) = $1",
                    key_id,
                )
            )
        finally:
            await conn.close()
    import sqlite3

    with sqlite3.connect(setup.workdir / "runq.db") as conn:
        row = conn.execute(
            "SELECT count(*) FROM runq_runs WHERE substr(payload, 4, 8) = ?", (key_id,)
        ).fetchone()
    return int(row[0])


async def unreadable(store: Store, ids: list[str]) -> int:
    failures = 0
    for run_id in ids:
        try:
            run = await store.get(run_id)
            assert run is not None
            assert run.payload == {"n": run_id}
        except SealError:
            failures += 1
    return failures


async def test_rotation_killed_half_way_resumes_and_leaves_every_run_readable(
    runq_setup: RunqSetup,
) -> None:
    own = [new_run_id() for _ in range(RUNS)]
    async with runq_setup.queue() as q:
        # Each payload names its own run, so a value moved to another row would show.
        await q.store.submit_many(
            [
                NewRun(id=i, component_type="task", component_id="echo", payload={"n": i})
                for i in own
            ]
        )

    new_key_file: Path = runq_setup.workdir / "new.key"
    new_key_file.write_text(generate_key() + "\n")
    new_key_id = key_id_of(decode_key(new_key_file.read_text(), key_name="test"))
    both = write_toml(
        runq_setup.workdir / "both.toml",
        runq_setup.config_dict(
            {"seal": {"keys": [f"file:{new_key_file}", f"file:{runq_setup.key_file}"]}}
        ),
    )

    def rotate() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runq",
                "keys",
                "rotate",
                "--page-size",
                "20",
                "--config",
                str(both),
            ],
            cwd=runq_setup.workdir,
            env=runq_setup.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    first = rotate()
    try:
        await wait_for(
            lambda: count_under_key(runq_setup, new_key_id),
            timeout=60,
            interval=0.01,
            message="the rotation re-seals some runs",
        )
        first.send_signal(signal.SIGKILL)
    finally:
        first.wait(timeout=30)
    half = await count_under_key(runq_setup, new_key_id)
    assert 0 < half < RUNS, f"killed after {half} of {RUNS}: not half-way"

    second = rotate()
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert f"re-sealed {RUNS - half} value(s)" in out
    assert await count_under_key(runq_setup, new_key_id) == RUNS

    only_new = runq_setup.load({"seal": {"keys": [f"file:{new_key_file}"]}})
    store = make_store(
        only_new.store.url, schema=only_new.store.schema, sealer=sealer_for(only_new)
    )
    await store.connect()
    try:
        assert await unreadable(store, own) == 0
    finally:
        await store.close()


async def test_rotation_service_pages_reports_and_resumes(runq_setup: RunqSetup) -> None:
    """``KeyRotation`` (what ``runq keys rotate`` calls): page by page, a callback per page,
    counts that add up, resumable after any page, and a second pass finds nothing to do."""
    runs = 230
    ids = sorted(new_run_id() for _ in range(runs))
    async with runq_setup.queue() as q:
        await q.store.submit_many(
            [
                NewRun(id=i, component_type="task", component_id="echo", payload={"n": i})
                for i in ids
            ]
        )
    new_key = generate_key()
    new_key_file = runq_setup.workdir / "service.key"
    new_key_file.write_text(new_key + "\n")
    both = runq_setup.load(
        {"seal": {"keys": [f"file:{new_key_file}", f"file:{runq_setup.key_file}"]}}
    )
    store = make_store(both.store.url, schema=both.store.schema, sealer=sealer_for(both))
    await store.connect()
    try:
        rotation = KeyRotation(store, page_size=40)
        first = await rotation.run_once()
        assert (first.pages, first.resealed, first.last_id) == (1, 40, ids[39])
        seen: list[str] = []

        async def on_page(report: RotationReport) -> None:
            seen.append(report.last_id)

        rest = await rotation.run(after_id=first.last_id, on_page=on_page)
        assert rest.done
        assert rest.resealed == runs - 40
        assert rest.pages == len(seen) == 5  # 190 runs in pages of 40
        assert seen == sorted(seen)
        assert seen[-1] == ids[-1] == rest.last_id
        assert (await rotation.run()).resealed == 0  # already under the new key
        assert (
            await count_under_key(runq_setup, key_id_of(decode_key(new_key, key_name="t"))) == runs
        )
    finally:
        await store.close()
