"""The operator and producer surfaces of schedules and unique runs, against a real replica
on both engines: ``/queue/schedules``, ``POST /runs`` with a unique key, and the CLI."""

from __future__ import annotations

import json

import pytest
from serve_harness import (  # fixtures are used by name
    RunqSetup,
    ServeFactory,
    runq_engine,
    runq_setup,
    serve_factory,
)

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

_FIXTURES = (runq_engine, runq_setup, serve_factory)

HOURLY = {"name": "hourly", "cron": "0 * * * *", "component": "task/record"}
CONFIG = {"schedules": [HOURLY]}


async def test_http_lists_pauses_and_resumes_schedules(serve_factory: ServeFactory) -> None:
    server = await serve_factory(CONFIG)
    listed = (await server.request("GET", "/queue/schedules")).json()
    assert [(s["name"], s["paused"], s["cron"]) for s in listed] == [
        ("hourly", False, HOURLY["cron"])
    ]
    assert listed[0]["next_fire_at"] % 3600 == 0
    paused = await server.request("POST", "/queue/schedules/hourly/pause")
    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"] is True
    assert paused.json()["next_fire_at"] is None
    listed = (await server.request("GET", "/queue/schedules")).json()
    assert listed[0]["paused"] is True
    resumed = await server.request("POST", "/queue/schedules/hourly/resume")
    assert resumed.json()["paused"] is False
    missing = await server.request("POST", "/queue/schedules/nope/pause")
    assert missing.status_code == 404


async def test_http_unique_key_answers_the_existing_run(serve_factory: ServeFactory) -> None:
    server = await serve_factory({"queue": {"worker": False}, **CONFIG})
    body = {
        "component_type": "task",
        "component_id": "record",
        "unique_key": "daily-digest",
        "unique_for_seconds": 60,
    }
    first = await server.request("POST", "/runs", json=body)
    assert first.status_code == 202, first.text
    assert first.json()["created"] is True
    second = await server.request("POST", "/runs", json={**body, "payload": {"other": 1}})
    assert second.status_code == 202, second.text
    assert second.json()["created"] is False
    assert second.json()["run_id"] == first.json()["run_id"]
    bad = await server.request("POST", "/runs", json={**body, "unique_states": ["asleep"]})
    assert bad.status_code == 400, bad.text
    bad = await server.request("POST", "/runs", json={**body, "unique_for_seconds": -1})
    assert bad.status_code == 400, bad.text


async def test_cli_schedules_and_unique_defer(runq_setup: RunqSetup) -> None:
    config = runq_setup.write_config(CONFIG)
    await runq_setup.cli("migrate", config=config)
    listed = await runq_setup.cli("schedules", "list", "--json", config=config)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)[0]["name"] == "hourly"
    table = await runq_setup.cli("schedules", "list", config=config)
    assert "hourly" in table.stdout
    assert "next fire" in table.stdout
    paused = await runq_setup.cli("schedules", "pause", "hourly", config=config)
    assert paused.stdout.strip() == "hourly paused"
    listed = await runq_setup.cli("schedules", "list", "--json", config=config)
    assert json.loads(listed.stdout)[0]["paused"] is True
    resumed = await runq_setup.cli("schedules", "resume", "hourly", config=config)
    assert resumed.stdout.strip() == "hourly resumed"
    missing = await runq_setup.cli("schedules", "pause", "nope", config=config)
    assert missing.returncode == 1
    assert "nope" in missing.stderr
    ids = []
    for _ in range(2):
        out = await runq_setup.cli(
            "defer", "task/record", "--unique-key", "k", "--unique-for", "60", config=config
        )
        assert out.returncode == 0, out.stderr
        ids.append(json.loads(out.stdout)["id"])
    assert ids[0] == ids[1]
