"""What an operator greps the daemon's log for: one ``run.completed`` line per completed
run with its duration, and the HTTP server's lines under runq's own name."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import wait_for
from serve_harness import ServeFactory, sqlite_serve_factory, sqlite_setup

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

__all__ = ["sqlite_serve_factory", "sqlite_setup"]  # fixtures used by name


def log_lines(text: str) -> list[dict[str, Any]]:
    lines = []
    for line in text.splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


async def test_completed_runs_are_logged_and_uvicorn_speaks_as_runq_http(
    sqlite_serve_factory: ServeFactory,
) -> None:
    server = await sqlite_serve_factory()
    response = await server.request(
        "POST", "/runs", json={"component_type": "task", "component_id": "echo", "payload": {}}
    )
    assert response.status_code in (200, 201, 202), response.text
    run_id = response.json()["run_id"]

    def completed_line() -> dict[str, Any] | None:
        for line in log_lines(server.logs()):
            if line["event"] == "run.completed" and line.get("run_id") == run_id:
                return line
        return None

    line = await wait_for(completed_line, timeout=30, message="a run.completed line")
    assert line["level"] == "info"
    assert line["component"] == "task/echo"
    assert isinstance(line["seconds"], float | int)
    assert line["seconds"] >= 0
    assert line["attempt"] == 1
    assert line["worker_id"]

    await server.terminate()
    loggers = {line["logger"] for line in log_lines(server.logs())}
    assert "runq.http" in loggers
    assert not {name for name in loggers if name.startswith("uvicorn")}, loggers
