"""The command line as a newcomer uses it: options before or after the command, ids that
can be pasted back, and first errors that say what to do."""

from __future__ import annotations

import json
import os
import re

import anyio
import pytest
from cli_process import run, run_on_terminal
from serve_harness import RunqSetup, pg_ready, pg_setup, runq_engine, runq_setup, sqlite_setup

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

__all__ = ["pg_ready", "pg_setup", "runq_engine", "runq_setup", "sqlite_setup"]  # by name

UUID_SHAPED = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def defer(setup: RunqSetup, config: str, n: int) -> list[str]:
    ids = []
    for i in range(n):
        result = run(setup, "--config", config, "defer", "task/echo", "--payload", f'{{"n": {i}}}')
        assert result.returncode == 0, result.stderr
        ids.append(json.loads(result.stdout)["id"])
    return ids


async def test_global_options_work_before_or_after_the_command(sqlite_setup: RunqSetup) -> None:
    good = str(sqlite_setup.write_config())
    missing = str(sqlite_setup.workdir / "missing.toml")
    args = ("status", "--json", "--minimum-workers", "0")
    assert run(sqlite_setup, "--config", good, "migrate").returncode == 0

    before = run(sqlite_setup, "--config", good, *args)
    after = run(sqlite_setup, *args, "--config", good)
    assert (before.returncode, after.returncode) == (0, 0), before.stderr + after.stderr

    # A file given on the command line, in either place, wins over RUNQ_CONFIG.
    env = {"RUNQ_CONFIG": missing}
    assert run(sqlite_setup, "--config", good, *args, env=env).returncode == 0
    assert run(sqlite_setup, *args, "--config", good, env=env).returncode == 0
    assert run(sqlite_setup, *args, env=env).returncode == 2
    # Given twice, the one after the command's name is the command's own.
    assert run(sqlite_setup, "--config", missing, *args, "--config", good).returncode == 0
    refused = run(sqlite_setup, "--config", good, *args, "--config", missing)
    assert refused.returncode == 2
    assert "missing.toml" in refused.stderr

    url = sqlite_setup.store_url
    by_url = run(sqlite_setup, "--store-url", url, "--config", good, *args)
    assert by_url.returncode == 0, by_url.stderr
    helped = run(sqlite_setup, "--help")
    assert "--config" in helped.stdout
    assert "--store-url" in helped.stdout


async def test_jobs_list_shows_whole_ids_piped_and_on_a_narrow_terminal(
    sqlite_setup: RunqSetup,
) -> None:
    config = str(sqlite_setup.write_config())
    ids = defer(sqlite_setup, config, 3)

    piped = run(sqlite_setup, "--config", config, "jobs", "list", env={"COLUMNS": "80"})
    assert piped.returncode == 0, piped.stderr
    assert set(UUID_SHAPED.findall(piped.stdout)) == set(ids), piped.stdout

    code, shown = await anyio.to_thread.run_sync(
        lambda: run_on_terminal(sqlite_setup, "--config", config, "jobs", "list", columns=80)
    )
    assert code == 0, shown
    assert set(UUID_SHAPED.findall(shown)) == set(ids), shown
    assert "…" not in "".join(line.split("│")[1] for line in shown.splitlines() if "│" in line)


async def test_every_jobs_command_takes_a_unique_prefix(runq_setup: RunqSetup) -> None:
    config = str(runq_setup.write_config())
    first, second = defer(runq_setup, config, 2)
    common = os.path.commonprefix([first, second])  # noqa: RUF071 - ids, not paths
    assert common, "two ids made in one process share their time prefix"
    unique = second[: len(common) + 1]

    shown = run(runq_setup, "--config", config, "jobs", "show", unique, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["id"] == second

    cancelled = run(runq_setup, "--config", config, "jobs", "cancel", unique)
    assert cancelled.stdout.strip() == f"{second} cancelled", cancelled.stderr
    requeued = run(runq_setup, "--config", config, "jobs", "requeue", unique, "--json")
    assert json.loads(requeued.stdout)["id"] == second, requeued.stderr

    ambiguous = run(runq_setup, "--config", config, "jobs", "show", common)
    assert ambiguous.returncode == 1
    assert first in ambiguous.stderr
    assert second in ambiguous.stderr
    assert "Traceback" not in ambiguous.stderr

    unknown = run(runq_setup, "--config", config, "jobs", "cancel", "zz-no-such-run")
    assert unknown.returncode == 1
    assert "no run zz-no-such-run" in unknown.stderr


async def test_an_unreachable_postgres_is_reported_before_a_missing_seal_key(
    sqlite_setup: RunqSetup,
) -> None:
    url = "postgresql://postgres@127.0.0.1:1/nothing"
    for args in (("status",), ("migrate",), ("jobs", "list")):
        result = run(sqlite_setup, "--store-url", url, *args)
        assert result.returncode == 1, (args, result.stderr)
        assert "unavailable" in result.stderr, result.stderr
        assert "seal.keys" not in result.stderr


async def test_a_fresh_postgres_schema_says_to_run_migrate(pg_setup: RunqSetup) -> None:
    config = str(pg_setup.write_config())
    for args in (("status",), ("jobs", "list")):
        result = run(pg_setup, "--config", config, *args)
        assert result.returncode == 1, result.stderr
        assert "the schema is not migrated: run `runq migrate`" in result.stderr
    assert run(pg_setup, "--config", config, "migrate").returncode == 0
    listed = run(pg_setup, "--config", config, "jobs", "list")
    assert listed.returncode == 0, listed.stderr


async def test_a_reachable_postgres_without_a_seal_key_names_the_key(
    pg_setup: RunqSetup,
) -> None:
    config = pg_setup.write_config({"seal": {"keys": []}})
    result = run(pg_setup, "--config", str(config), "status")
    assert result.returncode == 2
    assert "seal.keys" in result.stderr
