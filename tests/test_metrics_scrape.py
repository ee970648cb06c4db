"""Scrape ``/metrics`` of a real ``runq serve`` after a known mix of runs (both engines)."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import wait_for
from prometheus_client.parser import text_string_to_metric_families
from serve_harness import RunqSetup, ServeFactory, runq_engine, runq_setup, serve_factory

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = ["runq_engine", "runq_setup", "serve_factory"]  # fixtures used by name

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


async def submit(server: Any, component_id: str, payload: Any, **extra: Any) -> str:
    body = {"component_type": "task", "component_id": component_id, "payload": payload, **extra}
    response = await server.request("POST", "/runs", json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["run_id"])


async def test_metrics_after_a_known_mix_of_runs(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    server = await serve_factory({"queue": {"max_concurrency": 7, "poll_interval": 0.1}})
    for i in range(3):
        await submit(server, "echo", {"i": i})
    for _ in range(2):
        await submit(server, "fail", {"message": "no", "permanent": True})
    await submit(server, "approve", {})
    await submit(server, "echo", {"later": True}, delay_seconds=3600)

    async def settled() -> bool:
        stats = (await server.request("GET", "/queue/stats")).json()
        return bool(stats["counts"] == {"completed": 3, "failed": 2, "paused": 1, "queued": 1})

    await wait_for(settled, timeout=30, message="the mix settles")

    scraped: Samples = {}

    async def gauges_fresh() -> bool:
        # DB-derived gauges are cached for a few seconds; wait for a refresh that saw the mix.
        nonlocal scraped
        scraped = parse((await server.request("GET", "/metrics")).text)
        return value(scraped, "runq_runs", status="completed") == 3

    await wait_for(gauges_fresh, timeout=20, interval=0.5, message="gauges refresh")
    s = scraped
    assert value(s, "runq_runs", status="failed") == 2
    assert value(s, "runq_runs", status="paused") == 1
    assert value(s, "runq_runs", status="queued") == 1
    assert value(s, "runq_runs", status="running") in (0, None)
    assert (
        value(s, "runq_runs_finished_total", outcome="completed", termination_reason="completed")
        == 3
    )
    assert (
        value(s, "runq_runs_finished_total", outcome="failed", termination_reason="not_retryable")
        == 2
    )
    assert value(s, "runq_runs_finished_total", outcome="paused", termination_reason="") == 1
    assert value(s, "runq_claims_total") == 6
    assert value(s, "runq_submissions_total", origin="http") == 7
    assert value(s, "runq_queue_wait_seconds_count", component_type="task") == 6
    assert (
        value(s, "runq_run_duration_seconds_count", component_type="task", outcome="completed") == 3
    )
    assert value(s, "runq_in_flight_runs") == 0
    assert value(s, "runq_concurrency_limit") == 7
    assert value(s, "runq_live_workers") == 1
    assert value(s, "runq_expired_leases") == 0
    # The delayed run is not waiting yet: no claimable queued run, so no age to report.
    assert value(s, "runq_oldest_queued_age_seconds", deployment_id="") in (0, None)
    assert value(s, "runq_leases_lost_total") == 0
    assert (value(s, "runq_event_loop_lag_seconds") or 0) >= 0
    assert value(s, "process_resident_memory_bytes") is not None
