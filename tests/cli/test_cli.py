"""The ``runq`` command line: exit codes, one-line errors, and the operator commands."""

from __future__ import annotations

import json

import pytest
from serve_harness import RunqSetup, pg_ready, runq_engine, runq_setup, sqlite_setup, write_toml

from runq.seal import generate_key

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

__all__ = ["pg_ready", "runq_engine", "runq_setup", "sqlite_setup"]  # fixtures used by name

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/nothing"


async def test_status_exit_codes(sqlite_setup: RunqSetup) -> None:
    assert (await sqlite_setup.cli("migrate")).returncode == 0
    healthy = await sqlite_setup.cli("status", "--minimum-workers", "0", "--json")
    assert healthy.returncode == 0, healthy.stderr
    body = json.loads(healthy.stdout)
    assert body["healthy"] is True
    assert body["problems"] == []

    no_workers = await sqlite_setup.cli("status")
    assert no_workers.returncode == 1
    assert "live worker" in no_workers.stdout

    sqlite_setup.store_url = UNREACHABLE
    # Invalid arguments are refused before any query: 2, not the 1 of an unreadable database.
    assert (await sqlite_setup.cli("status", "--max-queue-wait", "-1")).returncode == 2
    assert (await sqlite_setup.cli("status", "--worker-max-age", "0")).returncode == 2
    unreadable = await sqlite_setup.cli("status")
    assert unreadable.returncode == 1
    assert "database unreadable" in unreadable.stderr
    assert "Traceback" not in unreadable.stderr


async def test_config_errors_name_the_key_and_exit_2(sqlite_setup: RunqSetup) -> None:
    bad = sqlite_setup.write_config({"queue": {"lock_grace": 5}})
    result = await sqlite_setup.cli("status", config=bad)
    assert result.returncode == 2
    assert "queue.lock_grace" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


async def test_reap_and_purge_print_their_counts(sqlite_setup: RunqSetup) -> None:
    assert (await sqlite_setup.cli("migrate")).returncode == 0
    assert (await sqlite_setup.cli("reap", "--limit", "0")).returncode == 2
    reaped = await sqlite_setup.cli("reap", "--limit", "10")
    assert reaped.returncode == 0, reaped.stderr
    assert reaped.stdout.split("\n")[:3] == ["requeued: 0", "dead-lettered: 0", "skipped: 0"]
    purged = await sqlite_setup.cli("purge")
    assert (purged.returncode, purged.stdout.strip()) == (0, "deleted: 0")


async def test_jobs_commands(runq_setup: RunqSetup) -> None:
    deferred = await runq_setup.cli(
        "defer", "task/echo", "--payload", '{"x": 1}', "--priority", "3"
    )
    assert deferred.returncode == 0, deferred.stderr
    run = json.loads(deferred.stdout)
    assert (run["status"], run["priority"], run["origin"]) == ("queued", 3, "cli")
    assert run["actor"]["service_account"] is True

    listed = json.loads((await runq_setup.cli("jobs", "list", "--json")).stdout)
    assert [job["id"] for job in listed["data"]] == [run["id"]]
    assert listed["meta"]["total_count"] == 1

    shown = json.loads((await runq_setup.cli("jobs", "show", run["id"], "--json")).stdout)
    assert shown["payload"] == {"x": 1}

    cancelled = await runq_setup.cli("jobs", "cancel", run["id"])
    assert cancelled.stdout.strip() == f"{run['id']} cancelled"
    requeued = await runq_setup.cli("jobs", "requeue", run["id"], "--json")
    assert json.loads(requeued.stdout)["status"] == "queued"
    refused = await runq_setup.cli("jobs", "continue", run["id"], "--decision", "true")
    assert refused.returncode == 1
    assert "only a paused run can be continued" in refused.stderr
    missing = await runq_setup.cli("jobs", "show", "no-such-run")
    assert missing.returncode == 1


async def test_keys_generate_and_rotate(sqlite_setup: RunqSetup) -> None:
    generated = await sqlite_setup.cli("keys", "generate")
    assert generated.returncode == 0
    assert len(generated.stdout.strip()) == 43
    assert (await sqlite_setup.cli("migrate")).returncode == 0
    await sqlite_setup.cli("defer", "task/echo", "--payload", '{"sealed": true}')

    new_key = sqlite_setup.workdir / "new.key"
    new_key.write_text(generate_key() + "\n")
    both = sqlite_setup.config_dict(
        {"seal": {"keys": [f"file:{new_key}", f"file:{sqlite_setup.key_file}"]}}
    )
    rotated = await sqlite_setup.cli(
        "keys", "rotate", config=write_toml(sqlite_setup.workdir / "both.toml", both)
    )
    assert rotated.returncode == 0, rotated.stderr
    assert "re-sealed 1 value(s)" in rotated.stdout

    only_new = sqlite_setup.config_dict({"seal": {"keys": [f"file:{new_key}"]}})
    listed = await sqlite_setup.cli(
        "jobs", "list", "--json", config=write_toml(sqlite_setup.workdir / "new.toml", only_new)
    )
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["data"][0]["payload"] == {"sealed": True}


async def test_jobs_list_filters_and_pages_by_cursor(runq_setup: RunqSetup) -> None:
    ids = []
    for n in range(3):
        deferred = await runq_setup.cli(
            "defer", "task/echo", "--payload", f'{{"n": {n}}}', "--delay", "3600"
        )
        assert deferred.returncode == 0, deferred.stderr
        ids.append(json.loads(deferred.stdout)["id"])

    seen: list[str] = []
    cursor: list[str] = []
    while True:
        listed = await runq_setup.cli("jobs", "list", "--json", "--limit", "2", *cursor)
        assert listed.returncode == 0, listed.stderr
        page = json.loads(listed.stdout)
        seen += [job["id"] for job in page["data"]]
        if page["next_cursor"] is None:
            break
        cursor = ["--cursor", page["next_cursor"]]
    assert seen == ids[::-1]

    table = await runq_setup.cli("jobs", "list", "--limit", "1")
    assert "next: --cursor " in table.stdout
    none = await runq_setup.cli("jobs", "list", "--json", "--component", "task/other")
    assert json.loads(none.stdout)["data"] == []
    mine = await runq_setup.cli("jobs", "list", "--json", "--component", "task/*", "--user", "cli")
    assert len(json.loads(mine.stdout)["data"]) == 3
    for bad in (["--cursor", "x"], ["--created-after", "soon"], ["--component", "a b"]):
        refused = await runq_setup.cli("jobs", "list", *bad)
        assert refused.returncode == 2, bad
        assert refused.stderr.strip(), bad
