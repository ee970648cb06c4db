"""One runq container for a test: started as the docs tell operators to run it, reached
over HTTP, stopped with SIGTERM, and its runs read back with the host's ``runq`` CLI.

Containers share the host's network (``--network host``): runq listens on a free
loopback port and reaches the machine's PostgreSQL at 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from helpers import wait_for_sync

from container.podman import exit_code, logs, podman

START_TIMEOUT = 90.0
RUN_TIMEOUT = 60.0
#: Longer than the drain (stop_timeout_seconds, 30 s by default), as the docs say.
STOP_TIMEOUT = 45
#: The hardening the docs give every runq container.
HARDENING = (
    "--read-only",
    "--read-only-tmpfs=false",  # podman's extra tmpfs on /tmp, /run: runq needs none
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunqContainer:
    name: str
    port: int
    api_key: str

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def get(self, path: str, *, auth: bool = True) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.api_key}"} if auth else {}
        return httpx.get(self.url(path), headers=headers, timeout=10)

    def submit(self, component: str, payload: Any, **options: Any) -> str:
        kind, _, name = component.partition("/")
        body = {"component_type": kind, "component_id": name, "payload": payload, **options}
        response = httpx.post(
            self.url("/runs"),
            json=body,
            headers={"Authorization": f"Bearer {self.api_key}"},
            timeout=10,
        )
        assert response.status_code in (200, 202), response.text
        return str(response.json()["run_id"])

    def run(self, run_id: str) -> dict[str, Any]:
        response = self.get(f"/runs/{run_id}")
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    def wait_status(self, run_id: str, *statuses: str) -> dict[str, Any]:
        return wait_run_status(lambda: self.run(run_id), statuses, lambda: logs(self.name))


def wait_run_status(
    fetch: Callable[[], dict[str, Any]],
    statuses: Sequence[str],
    describe: Callable[[], str],
) -> dict[str, Any]:
    """Poll ``fetch()`` (a run as the API shows it) until its status is one of
    ``statuses``; on the deadline, fail with the run's last state and ``describe()``
    (the containers' logs)."""
    seen: list[dict[str, Any]] = []

    def reached() -> dict[str, Any] | None:
        seen[:] = [fetch()]
        return seen[0] if seen[0].get("status") in statuses else None

    try:
        found: dict[str, Any] = wait_for_sync(
            reached, timeout=RUN_TIMEOUT, interval=0.2, message="run"
        )
    except AssertionError:
        raise AssertionError(
            f"the run never became {'/'.join(statuses)}: {seen}\n{describe()}"
        ) from None
    return found


def answers(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return None


def start_runq(
    image: str,
    name: str,
    *,
    env: Mapping[str, str],
    options: Sequence[str] = (),
) -> RunqContainer:
    """``podman run -d`` runq with the docs' hardening and wait until /readyz answers 200."""
    port = free_port()
    api_key = secrets.token_hex(32)
    environment = {"RUNQ_API_KEY": api_key, "RUNQ_HTTP_LISTEN": f"127.0.0.1:{port}", **env}
    env_args = [f"--env={key}={value}" for key, value in environment.items()]
    podman(
        "run", "--detach", f"--name={name}", "--network=host",
        f"--stop-timeout={STOP_TIMEOUT}", *HARDENING, *options, *env_args, image,
    )  # fmt: skip
    container = RunqContainer(name=name, port=port, api_key=api_key)
    wait_for_sync(
        lambda: answers(container.url("/readyz")) == 200,
        timeout=START_TIMEOUT,
        interval=0.2,
        message=f"{name} never answered /readyz with 200\n{logs(name)}",
    )
    return container


def stop(container: RunqContainer) -> None:
    """``podman stop``: SIGTERM, then SIGKILL after the container's --stop-timeout."""
    podman("stop", container.name, timeout=STOP_TIMEOUT + 30)


def stop_with_run_in_flight(container: RunqContainer, seconds: float) -> tuple[str, dict[str, Any]]:
    """Start a ``task/sleep`` of ``seconds``, stop the container once it runs, and check
    the drain ran to a clean exit. Returns the run id and the ``daemon.drained`` event."""
    run_id = container.submit("task/sleep", {"seconds": seconds})
    container.wait_status(run_id, "running")
    stop(container)
    assert exit_code(container.name) == 0, logs(container.name)
    events = {event.get("event"): event for event in log_events(container.name)}
    for wanted in ("daemon.draining", "daemon.drained", "daemon.stopped"):
        assert wanted in events, f"never logged {wanted}\n{logs(container.name)}"
    assert events["daemon.draining"]["in_flight"] == 1
    assert events["daemon.stopped"]["graceful"] is True
    return run_id, events["daemon.drained"]


def log_events(name: str) -> list[dict[str, Any]]:
    """The container's structured log lines (runq logs one JSON object a line)."""
    events = []
    for line in logs(name).splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def show_run(run_id: str, env: Mapping[str, str]) -> dict[str, Any]:
    """``runq jobs show ID --json`` on the host, against the store the container used."""
    done = subprocess.run(
        [sys.executable, "-m", "runq", "jobs", "show", run_id, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("RUNQ_")}, **env},
        check=False,
    )
    assert done.returncode == 0, f"runq jobs show exited {done.returncode}: {done.stderr}"
    shown: dict[str, Any] = json.loads(done.stdout)
    return shown
