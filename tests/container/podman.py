"""podman for the container tests: the sandbox's settings on every command, output kept
for the failure report, and everything a test starts removed at its end.

Every command runs with ``CONTAINERS_CONF`` set to ``sandbox-containers.conf`` (runc, and
resource limits the sandbox may set; see that file). ``RUNQ_TEST_CONTAINERS_CONF`` names
another file, or ``""`` for podman's own configuration.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
HERE = Path(__file__).resolve().parent
SANDBOX_CONF = HERE / "sandbox-containers.conf"
#: What the tests need from Debian (scripts/install-podman installs them).
TOOLS = ("podman", "runc", "mmdebstrap")
COMMAND_TIMEOUT = 120.0


class PodmanError(AssertionError):
    """A podman command failed; the message holds its command line and output."""


def podman_environment() -> dict[str, str]:
    env = dict(os.environ)
    conf = os.environ.get("RUNQ_TEST_CONTAINERS_CONF", str(SANDBOX_CONF))
    if conf:
        env["CONTAINERS_CONF"] = conf
    else:
        env.pop("CONTAINERS_CONF", None)
    return env


def run(
    argv: Sequence[str | Path],
    *,
    timeout: float = COMMAND_TIMEOUT,
    check: bool = True,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """One command (podman or a packaging script) with the sandbox's podman settings."""
    args = [str(a) for a in argv]
    done = subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=podman_environment(),
        cwd=cwd,
        check=False,
    )
    if check and done.returncode != 0:
        raise PodmanError(
            f"{' '.join(args)} exited {done.returncode}\n"
            f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-4000:]}"
        )
    return done


def podman(*args: str | Path, timeout: float = COMMAND_TIMEOUT, check: bool = True) -> str:
    return run(["podman", *args], timeout=timeout, check=check).stdout


def podman_json(*args: str | Path) -> Any:
    return json.loads(podman(*args))


_state: dict[str, str | None] = {}


def _unusable() -> str | None:
    """None when podman and the build tools are here and podman runs, else the reason."""
    if "reason" not in _state:
        missing = [tool for tool in TOOLS if shutil.which(tool) is None]
        if os.geteuid() != 0:
            # mmdebstrap, podman's root storage and the volumes' ownership (uid 10001).
            _state["reason"] = "the container tests run podman as root"
        elif missing:
            _state["reason"] = (
                f"{', '.join(missing)} not installed (scripts/install-podman installs them)"
            )
        else:
            done = run(["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"], check=False)
            _state["reason"] = (
                None if done.returncode == 0 else f"podman info failed: {done.stderr.strip()}"
            )
    return _state["reason"]


def require_podman() -> None:
    """Skip without podman; under CI=true fail instead, like PostgreSQL and Chromium."""
    reason = _unusable()
    if reason is not None:
        if IN_CI:
            pytest.fail(f"{reason}; CI=true: the container tests must run")
        pytest.skip(reason)


def logs(name: str) -> str:
    done = run(["podman", "logs", name], check=False)
    return done.stdout + done.stderr


def remove_container(name: str) -> None:
    """Force-remove a container and its anonymous volumes; absent is fine."""
    podman("rm", "--force", "--volumes", "--time", "0", name, check=False)


@contextlib.contextmanager
def removed_afterwards(*names: str) -> Iterator[None]:
    """Containers that must not outlive the block, whatever happens inside it (a stale
    one of an earlier, killed run is removed first)."""
    for name in names:
        remove_container(name)
    try:
        yield
    finally:
        for name in names:
            remove_container(name)


#: Every container a test starts is named with this prefix.
TEST_PREFIX = "runq-test-"
#: A test container this old belongs to a run that was killed before its cleanup.
ABANDONED_SECONDS = 3600


def remove_abandoned_containers() -> None:
    """Test containers left by a killed run (SIGKILL skips every finally): a live run's
    containers are minutes old at most, so an hour-old one is nobody's."""
    listed = json.loads(podman("ps", "--all", "--format", "json") or "[]")
    cutoff = time.time() - ABANDONED_SECONDS
    for entry in listed:
        names = entry.get("Names") or []
        if any(n.startswith(TEST_PREFIX) for n in names) and entry.get("Created", 0) < cutoff:
            for name in names:
                remove_container(name)


def exit_code(name: str) -> int:
    return int(podman("inspect", "--format", "{{.State.ExitCode}}", name).strip())


def image_size(image: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", image).strip())


def image_exists(image: str) -> bool:
    return run(["podman", "image", "exists", image], check=False).returncode == 0


def image_id(image: str) -> str:
    return podman("image", "inspect", "--format", "{{.Id}}", image).strip()
