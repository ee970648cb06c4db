"""Finding 4: errors follow the privacy level.

A run's ``error`` and the ``run.failed`` log line carried the handler's message verbatim,
and a message often quotes the payload (an exception about the input, an upstream body).
The message is now kept as the privacy level keeps answers: masked at ``redacted``, a
generic line at ``none``; and it never appears on an INFO log line. The full text stays
in a sealed column (``error_detail``) that only admins open: ``GET /queue/jobs/{id}`` and
``runq jobs show``, never ``GET /runs/{id}``; it is purged with its run and re-sealed by
``runq keys rotate``.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_for
from serve_harness import (
    RunqSetup,
    ServeFactory,
    pg_ready,
    runq_engine,
    runq_setup,
    serve_factory,
    write_toml,
)
from store.factories import at_offset

from runq.context import RunContext
from runq.errors import Permanent, Retryable
from runq.privacy import ERROR_NOT_KEPT
from runq.seal import generate_key

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

__all__ = ["pg_ready", "runq_engine", "runq_setup", "serve_factory"]  # fixtures used by name

SECRET = "sk-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6"
FULL = f"upstream refused 'token {SECRET} for alice@example.com'"
#: Rich markup and an OSC 52 (clipboard write) sequence: shown literally, never obeyed.
HOSTILE = "[bold red]boom[/] \x1b]52;c;ZXZpbA==\x07 done"


async def leak(ctx: RunContext, payload: Any) -> Any:
    """A handler whose error message quotes its payload, as real ones do."""
    raise Permanent(f"upstream refused {payload['text']!r}")


async def leak_later(ctx: RunContext, payload: Any) -> Any:
    """The same message on a retryable failure, retried only much later."""
    raise Retryable(f"upstream refused {payload['text']!r}", retry_after=3600)


async def hostile(ctx: RunContext, payload: Any) -> Any:
    raise Permanent(HOSTILE)


_MODULE = "hardening.test_errors_follow_privacy"
PAYLOAD = json.dumps({"text": f"token {SECRET} for alice@example.com"})


def _config(level: str, **queue: Any) -> dict[str, Any]:
    return {
        "privacy": {"level": level},
        "queue": queue,
        "components": {
            "task/leak": f"{_MODULE}:leak",
            "task/leak_later": f"{_MODULE}:leak_later",
            "task/hostile": f"{_MODULE}:hostile",
        },
    }


async def _worked_run(
    setup: RunqSetup, level: str, component: str = "task/leak", **queue: Any
) -> tuple[dict[str, Any], str]:
    """Defer one run of ``component``, let ``runq work`` execute it, and show it."""
    config = setup.write_config(_config(level, **queue))
    deferred = await setup.cli("defer", component, "--payload", PAYLOAD, config=config)
    assert deferred.returncode == 0, deferred.stderr
    worked = await setup.cli("work", "--log-format", "json", config=config)
    assert worked.returncode == 0, worked.stderr
    shown = await setup.cli("jobs", "show", json.loads(deferred.stdout)["id"], "--json")
    assert shown.returncode == 0, shown.stderr
    run: dict[str, Any] = json.loads(shown.stdout)
    return run, worked.stderr


async def _failed_run(setup: RunqSetup, level: str) -> tuple[dict[str, Any], str]:
    run, logs = await _worked_run(setup, level)
    assert run["status"] == "failed"
    return run, logs


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


# -- the full text, sealed, for admins ---------------------------------------------------------


@pytest.mark.parametrize("level", ["none", "redacted", "full"])
async def test_the_full_text_stays_sealed_for_admins(runq_setup: RunqSetup, level: str) -> None:
    run, _ = await _failed_run(runq_setup, level)
    assert run["error_detail"] == FULL
    if level != "full":
        assert SECRET not in run["error"]
    if runq_setup.engine == "sqlite":
        # Nothing in the database files holds the message in clear: the detail is sealed.
        stored = b"".join(p.read_bytes() for p in runq_setup.workdir.glob("runq.db*"))
        assert stored, "no database files found"
        if level != "full":
            assert SECRET.encode() not in stored


async def test_a_retried_failure_keeps_its_full_text_too(runq_setup: RunqSetup) -> None:
    run, _ = await _worked_run(runq_setup, "redacted", "task/leak_later", max_attempts=2)
    assert run["status"] == "queued"
    assert SECRET not in run["error"]
    assert run["error_detail"] == FULL


async def test_runq_jobs_show_prints_the_detail_literally(runq_setup: RunqSetup) -> None:
    run, _ = await _worked_run(runq_setup, "full", "task/hostile")
    assert run["error_detail"] == HOSTILE
    shown = await runq_setup.cli("jobs", "show", run["id"])
    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout
    detail = next(line for line in shown.stdout.splitlines() if "error_detail" in line)
    assert "[bold red]boom[/]" in detail


async def test_only_the_admin_surface_shows_the_detail(
    runq_setup: RunqSetup, serve_factory: ServeFactory
) -> None:
    server = await serve_factory(_config("redacted"))
    deferred = await runq_setup.cli(
        "defer", "task/leak", "--payload", PAYLOAD, config=server.config_path
    )
    assert deferred.returncode == 0, deferred.stderr
    run_id = json.loads(deferred.stdout)["id"]

    async def failed() -> dict[str, Any] | None:
        job: dict[str, Any] = (await server.request("GET", f"/queue/jobs/{run_id}")).json()
        return job if job["status"] == "failed" else None

    job = await wait_for(failed, timeout=30, message="the run fails")
    assert job["error_detail"] == FULL
    assert SECRET not in job["error"]
    seen = await server.request("GET", f"/runs/{run_id}")
    assert seen.status_code == 200, seen.text
    shown = seen.json()
    assert "error_detail" not in shown
    assert SECRET not in json.dumps({k: v for k, v in shown.items() if k != "payload"})
    listed = (await server.request("GET", "/queue/jobs", params={"status": "failed"})).json()
    [row] = listed["data"]
    assert row["error_detail"] is None  # the listing never opens it
    # The console's run page (open mode: an admin) shows it too, under the redacted error.
    page = await server.request("GET", f"/ui/runs/{run_id}")
    assert page.status_code == 200, page.text
    assert FULL in html.unescape(page.text)


async def test_the_detail_is_purged_with_its_run(runq_setup: RunqSetup) -> None:
    run, _ = await _failed_run(runq_setup, "redacted")
    async with runq_setup.queue() as q:
        assert await q.store.error_detail(run["id"]) == FULL
        purged = await at_offset(
            q.store,
            60,
            lambda: q.store.purge_batch(retention_seconds=1, paused_retention_seconds=0, limit=100),
        )
        assert purged == 1
        assert await q.store.error_detail(run["id"]) is None


async def test_key_rotation_reseals_the_detail(runq_setup: RunqSetup) -> None:
    run, _ = await _failed_run(runq_setup, "redacted")
    new_key = runq_setup.workdir / "new.key"
    new_key.write_text(generate_key() + "\n")
    new_key.chmod(0o600)

    def keys(*files: Path, name: str) -> Path:
        config = runq_setup.config_dict({"seal": {"keys": [f"file:{f}" for f in files]}})
        return write_toml(runq_setup.workdir / name, config)

    rotated = await runq_setup.cli(
        "keys", "rotate", config=keys(new_key, runq_setup.key_file, name="both.toml")
    )
    assert rotated.returncode == 0, rotated.stderr
    # payload and error_detail of the one run
    assert "re-sealed 2 value(s)" in rotated.stdout, rotated.stdout
    shown = await runq_setup.cli(
        "jobs", "show", run["id"], "--json", config=keys(new_key, name="new.toml")
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["error_detail"] == FULL
