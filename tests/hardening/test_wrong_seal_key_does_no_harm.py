"""Finding 8 (start-up part): a replica with the wrong seal key does no harm.

A daemon whose ``[seal] keys`` could not open the fleet's values claimed runs, failed to
open them and left them to the reaper, which dead-lettered every one. The database now
records the id of the fleet's sealing key (never the key) at migration; a replica whose
key ring cannot open values sealed under it refuses to start, naming ``seal.keys``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import wait_for
from serve_harness import RunqSetup, ServeFactory, pg_ready, runq_engine, runq_setup

from runq.seal import generate_key

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

__all__ = ["pg_ready", "runq_engine", "runq_setup"]  # fixtures used by name


def _key_file(setup: RunqSetup, name: str) -> Path:
    path = setup.workdir / name
    path.write_text(generate_key() + "\n")
    path.chmod(0o600)
    return path


def _keys(setup: RunqSetup, *files: Path) -> Path:
    return setup.write_config({"seal": {"keys": [f"file:{f}" for f in files]}})


async def test_a_replica_whose_keys_cannot_open_the_fleets_values_refuses_to_start(
    runq_setup: RunqSetup,
) -> None:
    assert (await runq_setup.cli("migrate")).returncode == 0  # records the fleet's key
    stranger = _key_file(runq_setup, "stranger.key")
    refused = await runq_setup.cli("serve", config=_keys(runq_setup, stranger), timeout=60)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "seal.keys" in refused.stderr
    assert "Traceback" not in refused.stderr


async def test_a_rotation_moves_the_fingerprint(runq_setup: RunqSetup) -> None:
    assert (await runq_setup.cli("migrate")).returncode == 0
    new = _key_file(runq_setup, "new.key")
    # The new key first, the old one kept: this ring opens the old values, and records the new.
    rotated = await runq_setup.cli("migrate", config=_keys(runq_setup, new, runq_setup.key_file))
    assert rotated.returncode == 0, rotated.stderr
    # A replica still holding only the old key cannot open what the fleet now seals.
    stale = await runq_setup.cli("migrate", config=_keys(runq_setup, runq_setup.key_file))
    assert stale.returncode == 2
    assert "seal.keys" in stale.stderr
    assert (await runq_setup.cli("migrate", config=_keys(runq_setup, new))).returncode == 0


async def test_a_claimed_run_that_cannot_be_opened_stops_the_replica_and_loses_nothing(
    runq_setup: RunqSetup,
) -> None:
    """The start-up check passes (the ring opens the fingerprint), yet a peer seals under a
    newer key: the run goes back to ``queued`` with its attempt unspent, this replica stops
    claiming, says why on ``/readyz`` and counts it; a replica with the fleet's keys runs it."""
    factory = ServeFactory(runq_setup)
    try:
        old_only = {"queue": {"poll_interval": 0.2}}
        stale = await factory(old_only)  # the setup's one key: the fleet's key at migration
        new = _key_file(runq_setup, "new.key")
        ring = {"seal": {"keys": [f"file:{new}", f"file:{runq_setup.key_file}"]}}
        async with runq_setup.queue(ring) as q:
            run_id = (await q.defer("task", "record", {"n": 1})).run.id

            async def given_back() -> bool:
                run = await q.get(run_id)
                return run is not None and run.status == "queued" and bool(run.error)

            await wait_for(given_back, timeout=30, message="unopenable run given back")
            run = await q.get(run_id)
            assert run is not None
            assert run.attempt == 0
            assert "seal" in (run.error or "")

            ready = await stale.request("GET", "/readyz")
            assert ready.status_code == 503
            assert "seal.keys" in ready.text
            scraped = (await stale.request("GET", "/metrics")).text
            assert "runq_unopenable_runs_total 1.0" in scraped

            await factory({"seal": ring["seal"], "queue": {"poll_interval": 0.2}})

            async def completed() -> bool:
                run = await q.get(run_id)
                return run is not None and run.status == "completed"

            await wait_for(completed, timeout=30, message="a replica with the keys ran it")
            # The stale replica claimed once and stopped: the metric did not climb.
            scraped = (await stale.request("GET", "/metrics")).text
            assert "runq_unopenable_runs_total 1.0" in scraped
    finally:
        await factory.stop_all()
