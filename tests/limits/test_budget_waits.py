"""A run held back by a budget cap says so on every surface (a real ``runq serve``, both
engines): ``GET /runs/{id}``, ``GET /queue/jobs/{id}``, ``runq jobs show`` and
``runq_held_runs{reason="budget"}``."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from helpers import wait_for
from prometheus_client.parser import text_string_to_metric_families
from serve_harness import RunqSetup, ServeFactory, runq_engine, runq_setup, serve_factory

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = ["runq_engine", "runq_setup", "serve_factory"]  # fixtures used by name

CONFIG = {
    "queue": {"poll_interval": 0.1},
    "budget": {
        "timezone": "UTC",
        "limits": [{"scope": "configuration", "period": "day", "max_runs": 1}],
    },
}
# "budget configuration:day of configuration gpt exhausted (runs 1/1) until <midnight>"
MESSAGE = re.compile(
    r"^budget configuration:day of configuration gpt exhausted \(runs 1/1\)"
    r" until \d{4}-\d\d-\d\dT00:00:00Z$"
)


async def submit(server: Any, configuration: str) -> str:
    body = {"component_type": "task", "component_id": "record", "configuration": configuration}
    response = await server.request("POST", "/runs", json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["run_id"])


async def completed(server: Any, run_id: str) -> bool:
    run = (await server.request("GET", f"/runs/{run_id}")).json()
    return bool(run["status"] == "completed")


def held(text: str, reason: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "runq_held_runs" and sample.labels.get("reason") == reason:
                return sample.value
    return None


async def test_a_budget_hold_is_the_wait_reason_and_is_counted(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    server = await serve_factory(CONFIG)
    first = await submit(server, "gpt")
    await wait_for(lambda: completed(server, first), timeout=20, message="the first gpt run")
    held_ids = [await submit(server, "gpt") for _ in range(2)]
    other = await submit(server, "small")
    await wait_for(lambda: completed(server, other), timeout=20, message="another configuration")
    # "small" was submitted after the gpt runs and ran: the claims passed them over.
    view = (await server.request("GET", f"/runs/{held_ids[0]}")).json()
    assert view["status"] == "queued", view
    waiting = view["waiting"]
    assert waiting["kind"] == "budget", waiting
    assert MESSAGE.match(waiting["message"]), waiting
    assert waiting["pattern"] == "configuration:day"
    assert waiting["until"] % 86400 == 0
    assert 0 < waiting["until"] - view["created_at"] <= 86400

    job = (await server.request("GET", f"/queue/jobs/{held_ids[1]}")).json()
    assert job["waiting"]["kind"] == "budget", job

    shown = await runq_setup.cli(
        "jobs", "show", held_ids[0], "--json", config=runq_setup.write_config(CONFIG)
    )
    assert shown.returncode == 0, shown.stderr
    assert MESSAGE.match(json.loads(shown.stdout)["waiting"]["message"])

    scraped = ""

    async def counted() -> bool:
        # The DB-derived gauges are cached for a few seconds.
        nonlocal scraped
        scraped = (await server.request("GET", "/metrics")).text
        return held(scraped, "budget") == 2

    await wait_for(counted, timeout=20, interval=0.5, message="held runs counted by budget")
    assert held(scraped, "limit") == 0
