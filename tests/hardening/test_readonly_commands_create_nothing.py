"""Finding 10: read-only commands do not create state.

``runq status --store-url sqlite:////nonexistent/dir/x.db`` created the directory and a seal
key file; ``runq work`` on a mistyped path migrated a fresh database and waited forever.
Commands that only read refuse a missing SQLite file (exit 1, one line naming it); the
database file, when it is created, is readable by its owner only.
"""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from serve_harness import RunqSetup, sqlite_setup

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

__all__ = ["sqlite_setup"]  # fixture used by name

READ_ONLY = [
    ["status"],
    ["jobs", "list"],
    ["jobs", "show", "some-run"],
    ["reap"],
    ["purge"],
    ["work", "--time-limit", "1"],
]


async def _runq(setup: RunqSetup, *args: str) -> subprocess.CompletedProcess[str]:
    """``runq ARGS`` with no config file: only the URL given, the embedded defaults."""
    return await anyio.to_thread.run_sync(lambda: _run_sync(setup, *args))


def _run_sync(setup: RunqSetup, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runq", *args],
        cwd=setup.workdir,
        env=setup.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("command", READ_ONLY, ids=" ".join)
async def test_read_only_commands_refuse_a_missing_sqlite_file(
    sqlite_setup: RunqSetup, command: list[str]
) -> None:
    missing_dir = sqlite_setup.workdir / "nonexistent" / "dir"
    url = f"sqlite:///{missing_dir / 'x.db'}"
    result = await _runq(sqlite_setup, *command, "--store-url", url)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (sqlite_setup.workdir / "nonexistent").exists()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_work_create_makes_a_private_database(sqlite_setup: RunqSetup) -> None:
    db = sqlite_setup.workdir / "fresh" / "x.db"
    db.parent.mkdir()
    url = f"sqlite:///{db}"
    result = await _runq(sqlite_setup, "work", "--create", "--time-limit", "1", "--store-url", url)
    assert result.returncode == 0, result.stderr
    assert _mode(db) == 0o600
    # And now that it exists, the read-only commands read it.
    listed = await _runq(sqlite_setup, "jobs", "list", "--json", "--store-url", url)
    assert listed.returncode == 0, listed.stderr


async def test_migrate_creates_the_database_owner_only(sqlite_setup: RunqSetup) -> None:
    db = sqlite_setup.workdir / "migrated.db"
    result = await _runq(sqlite_setup, "migrate", "--store-url", f"sqlite:///{db}")
    assert result.returncode == 0, result.stderr
    assert _mode(db) == 0o600
