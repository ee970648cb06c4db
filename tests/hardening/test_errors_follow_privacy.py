"""Finding 4: errors follow the privacy level.

A run's ``error`` and the ``run.failed`` log line carried the handler's message verbatim,
and a message often quotes the payload (an exception about the input, an upstream body).
The message is now kept as the privacy level keeps answers: masked at ``redacted``, a
generic line at ``none``; and it never appears on an INFO log line.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from serve_harness import RunqSetup, pg_ready, runq_engine, runq_setup

from runq.context import RunContext
from runq.errors import Permanent
from runq.privacy import ERROR_NOT_KEPT

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

__all__ = ["pg_ready", "runq_engine", "runq_setup"]  # fixtures used by name

SECRET = "sk-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6"


async def leak(ctx: RunContext, payload: Any) -> Any:
    """A handler whose error message quotes its payload, as real ones do."""
    raise Permanent(f"upstream refused {payload['text']!r}")


def _config(level: str) -> dict[str, Any]:
    return {
        "privacy": {"level": level},
        "components": {"task/leak": "hardening.test_errors_follow_privacy:leak"},
    }


async def _failed_run(setup: RunqSetup, level: str) -> tuple[dict[str, Any], str]:
    config = setup.write_config(_config(level))
    payload = json.dumps({"text": f"token {SECRET} for alice@example.com"})
    deferred = await setup.cli("defer", "task/leak", "--payload", payload, config=config)
    assert deferred.returncode == 0, deferred.stderr
    worked = await setup.cli("work", "--log-format", "json", config=config)
    assert worked.returncode == 0, worked.stderr
    shown = await setup.cli("jobs", "show", json.loads(deferred.stdout)["id"], "--json")
    run: dict[str, Any] = json.loads(shown.stdout)
    assert run["status"] == "failed"
    return run, worked.stderr


@pytest.mark.parametrize(
    ("level", "kept"),
    [("none", ERROR_NOT_KEPT), ("redacted", "upstream refused 'token [redacted] for [redacted]'")],
)
async def test_a_run_error_keeps_only_what_the_privacy_level_allows(
    runq_setup: RunqSetup, level: str, kept: str
) -> None:
    run, logs = await _failed_run(runq_setup, level)
    assert run["error"] == kept
    assert SECRET not in logs
    assert "alice@example.com" not in logs


async def test_the_failed_line_at_info_carries_no_message(runq_setup: RunqSetup) -> None:
    run, logs = await _failed_run(runq_setup, "full")
    assert SECRET in run["error"]  # full keeps it, in the run (for its owner and admins)
    failed = [json.loads(line) for line in logs.splitlines() if '"run.failed"' in line]
    assert failed, logs
    assert all("error" not in line for line in failed)
    assert SECRET not in logs
