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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from helpers import wait_for_sync

from container.podman import logs, podman

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
        def reached() -> dict[str, Any] | None:
            run = self.run(run_id)
            return run if run["status"] in statuses else None

        found: dict[str, Any] = wait_for_sync(
            reached,
            timeout=RUN_TIMEOUT,
            interval=0.2,
            message=f"run {run_id} never became {'/'.join(statuses)}\n{logs(self.name)}",
        )
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
