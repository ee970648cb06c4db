"""Finding 12: liveness from heartbeats.

A SIGKILLed worker stops heartbeating but counted as live in ``runq status`` for a fixed
120 s. A worker is live while its last heartbeat is younger than three heartbeat intervals
(one lock grace), the same rule in ``runq status``, the exporter and the console.
"""

from __future__ import annotations

import json

import pytest
from serve_harness import RunqSetup, pg_ready, runq_engine, runq_setup
from store.factories import at_offset

from runq.model import WorkerInfo
from runq.serve.exporter import ExporterConfig

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

__all__ = ["pg_ready", "runq_engine", "runq_setup"]  # fixtures used by name

#: Heartbeats every 10 s: a worker unseen for 30 s is gone.
LOCK_GRACE = {"queue": {"lock_grace_seconds": 30}}


async def _live_workers(setup: RunqSetup) -> int:
    result = await setup.cli(
        "status", "--minimum-workers", "0", "--json", config=setup.write_config(LOCK_GRACE)
    )
    assert result.returncode == 0, result.stderr
    live: int = json.loads(result.stdout)["live_workers"]
    return live


async def test_a_worker_silent_for_three_heartbeats_is_not_live(runq_setup: RunqSetup) -> None:
    async with runq_setup.queue(LOCK_GRACE) as q:
        silent = WorkerInfo(id="w-killed", hostname="h", pid=1, deployment_id=None)
        await at_offset(q.store, -45, lambda: q.store.register_worker(silent))
        assert await _live_workers(runq_setup) == 0

        recent = WorkerInfo(id="w-alive", hostname="h", pid=2, deployment_id=None)
        await at_offset(q.store, -15, lambda: q.store.register_worker(recent))
        assert await _live_workers(runq_setup) == 1


async def test_the_exporter_uses_the_same_heartbeat_age(runq_setup: RunqSetup) -> None:
    config = runq_setup.load(LOCK_GRACE)
    assert ExporterConfig.from_config(config).worker_max_age_seconds == 30
    assert config.queue.live_worker_seconds == 3 * config.queue.heartbeat_interval
