"""Finding 9: fleet settings that diverge are seen.

``lock_grace_seconds``, ``stop_timeout_seconds``, ``retention_seconds``, ``max_attempts``
and ``timeout_seconds`` act on other replicas' runs, so they must match across the fleet,
yet nothing noticed when they did not: a replica with a shorter lock grace reaped its
peers' live leases in silence. Each worker now records the values it runs with; ``runq
status`` and ``GET /queue/stats`` name a setting the live workers disagree on (values and
workers), ``runq_fleet_settings_divergent{setting}`` is 1 for it, and a replica whose lock
grace is shorter than a live peer's logs a warning at start.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from helpers import wait_for
from serve_harness import (
    RunqServer,
    RunqSetup,
    ServeFactory,
    pg_ready,
    runq_engine,
    runq_setup,
    serve_factory,
)
from store.factories import at_offset

from runq.config import FLEET_SETTINGS
from runq.model import WorkerInfo
from runq.ops.operations import Operations

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

__all__ = ["pg_ready", "runq_engine", "runq_setup", "serve_factory"]  # fixtures used by name

WARNING = "worker.lock_grace_shorter_than_peers"


def _grace(seconds: float) -> dict[str, Any]:
    return {"queue": {"lock_grace_seconds": seconds}}


async def _status(setup: RunqSetup) -> tuple[int, dict[str, Any]]:
    result = await setup.cli(
        "status", "--minimum-workers", "0", "--json", config=setup.write_config(_grace(60))
    )
    return result.returncode, json.loads(result.stdout)


def _divergent_gauge(metrics: str, setting: str) -> float | None:
    found = re.search(
        rf'^runq_fleet_settings_divergent{{setting="{setting}"}} (\S+)$', metrics, re.M
    )
    return None if found is None else float(found.group(1))


async def _worker_ids(setup: RunqSetup) -> dict[int, str]:
    """pid → worker id of the live workers, read from the workers table."""
    async with setup.queue(_grace(60)) as q:
        workers = await q.store.list_workers(max_age_seconds=60)
    return {w.pid: w.id for w in workers}


async def test_two_replicas_with_different_lock_grace_are_reported(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    first = await serve_factory(_grace(60))
    code, status = await _status(runq_setup)
    assert code == 0, status
    assert status["fleet_divergences"] == []
    assert (await first.request("GET", "/queue/stats")).json()["fleet_divergences"] == []

    second = await serve_factory(_grace(45))
    ids = await _worker_ids(runq_setup)
    expected = [
        {
            "setting": "lock_grace_seconds",
            "values": [
                {"value": 45.0, "workers": [ids[second.pid]]},
                {"value": 60.0, "workers": [ids[first.pid]]},
            ],
        }
    ]
    code, status = await _status(runq_setup)
    assert code == 1, status  # unhealthy: a shorter grace reaps its peers' live leases
    assert status["fleet_divergences"] == expected
    assert any("lock_grace_seconds differs" in p for p in status["problems"])
    for server in (first, second):
        stats = (await server.request("GET", "/queue/stats")).json()
        assert stats["fleet_divergences"] == expected

    metrics = await _metrics_once_refreshed(first)
    assert _divergent_gauge(metrics, "lock_grace_seconds") == 1
    for other in set(FLEET_SETTINGS) - {"lock_grace_seconds"}:
        assert _divergent_gauge(metrics, other) == 0, other

    # The replica with the shorter grace says so at start; the other has nothing to say.
    await wait_for(lambda: WARNING in second.logs(), timeout=10, message="the start warning")
    warning = next(json.loads(line) for line in second.logs().splitlines() if WARNING in line)
    assert warning["level"] == "warning"
    assert warning["peers"] == {ids[first.pid]: 60.0}
    assert WARNING not in first.logs()


async def _metrics_once_refreshed(server: RunqServer) -> str:
    """/metrics once the exporter's cached pass has seen both replicas (it caches for a
    few seconds, and a scrape may have come before the second replica registered)."""

    async def divergent() -> str | None:
        text = (await server.request("GET", "/metrics")).text
        return text if _divergent_gauge(text, "lock_grace_seconds") == 1 else None

    return await wait_for(divergent, timeout=20, interval=0.5, message="the gauge turns 1")


async def test_only_live_workers_count(runq_setup: RunqSetup) -> None:
    """A worker that stopped heartbeating (killed, its row not yet pruned) is no divergence:
    only the fleet as it runs now matters."""
    mine = runq_setup.load(_grace(60)).queue.fleet_settings()
    async with runq_setup.queue(_grace(60)) as q:
        live = WorkerInfo(id="w-live", hostname="h", pid=1, deployment_id=None, settings=mine)
        await q.store.register_worker(live)
        gone = WorkerInfo(
            id="w-gone",
            hostname="h",
            pid=2,
            deployment_id=None,
            settings={**mine, "retention_seconds": 60.0},
        )
        await at_offset(q.store, -300, lambda: q.store.register_worker(gone))
        assert (await Operations(q.store, q.config).stats()).fleet_divergences == []
        code, status = await _status(runq_setup)
        assert code == 0, status

        await q.store.register_worker(gone)  # seen again: now it counts
        [divergence] = (await Operations(q.store, q.config).stats()).fleet_divergences
        assert divergence.setting == "retention_seconds"
        assert [v.workers for v in divergence.values] == [["w-gone"], ["w-live"]]


async def test_each_worker_records_the_settings_it_applies(runq_setup: RunqSetup) -> None:
    config = runq_setup.load({"queue": {"lock_grace_seconds": 20, "max_attempts": 3}})
    recorded = config.queue.fleet_settings()
    assert set(recorded) == set(FLEET_SETTINGS)
    # stop_timeout_seconds unset: recorded as applied, min(30, grace - 1).
    assert recorded["stop_timeout_seconds"] == 19.0
    async with runq_setup.queue() as q:
        info = WorkerInfo(id="w-rec", hostname="h", pid=3, deployment_id=None, settings=recorded)
        await q.store.register_worker(info)
        [listed] = await q.store.list_workers(max_age_seconds=60)
        assert listed.settings == recorded
