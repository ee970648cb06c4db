"""The shipped sidecar manifest, played with ``podman kube play``: the application submits
over the pod's loopback, runq calls the application back over the pod's loopback, the
run completes, and ``podman pod stop`` drains both containers in the right order.

What the test changes in packaging/kubernetes/runq-sidecar.yaml, and why (nothing else;
``manifest.substituted`` checks it line by line):

- the two image names, to the images it built (``localhost/runq-test*:<hash>``);
- the declared ports 7777 and 8080, to free ones: podman kube play publishes every
  ``containerPort`` on the host (Kubernetes does not), and the machine is shared.

What it adds around the file, as an operator would around ``kubectl apply``:

- the Secret ``runq``, created with ``podman secret create`` from a JSON object of
  base64 values. podman 4.3 (Debian bookworm) reads ``secretKeyRef`` only in that form:
  it cannot read a Secret that ``podman kube play`` stored from YAML (it expects JSON);
- the pod runs on podman's default network, so it has its own loopback as in Kubernetes;
  the test reaches it through the published ports on 127.0.0.1.

Probes: podman 4.3 turns the liveness probe into a health check that only a systemd
timer would run, and ignores the readiness probe; the test runs both commands itself
(``podman healthcheck run``, ``podman exec``). Scraping: the test fetches the annotated
port and path as Prometheus would. The pod's names are fixed by the file, so a lock keeps
two runs on one machine apart; everything the play created is removed, pass or fail.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import wait_for_sync

from container import manifest
from container.images import CACHE, Images, machine_lock
from container.podman import exit_code, logs, podman, run
from container.runq_container import answers, free_port, show_run, wait_run_status
from runq.seal import generate_key

# xdist_group: one worker builds the images and runs these while the others go on with the
# suite. pytest 9.2 with pytest-xdist 3.8 ignores the group (xdist renames item._nodeid,
# which pytest 9.2 no longer reads), so a second worker may wait on the build lock instead.
pytestmark = [pytest.mark.daemon, pytest.mark.timeout(600), pytest.mark.xdist_group("container")]

START_TIMEOUT = 90.0
RUN_TIMEOUT = 60.0
GRACE = int(manifest.deployment()["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])
EXCERPT = CACHE / "sidecar-pod.log"


def pod_name() -> str:
    return f"{manifest.deployment()['metadata']['name']}-pod-0"


def remove_played(played: Path) -> None:
    """Whatever an earlier or this run of the file left: pod, volumes, secrets."""
    run(["podman", "kube", "down", played], check=False)
    podman("pod", "rm", "--force", "--time", "0", pod_name(), check=False)
    for volume in manifest.volume_names():
        podman("volume", "rm", "--force", volume, check=False)
    for secret in manifest.secret_refs():
        podman("secret", "rm", secret, check=False)


def create_secrets(values: dict[str, str]) -> None:
    ((name, keys),) = manifest.secret_refs().items()
    assert keys == set(values), f"the pod reads {sorted(keys)} from Secret {name}"
    encoded = {key: base64.b64encode(value.encode()).decode() for key, value in values.items()}
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(encoded, f)
        f.flush()
        podman("secret", "create", name, f.name)


@pytest.fixture
def played(images: Images, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The pod, playing: its published ports, secret values and names."""
    ports = {port: free_port() for port in manifest.SHIPPED_PORTS}
    text = manifest.substituted(
        {manifest.SHIPPED_RUNQ_IMAGE: images.runq, manifest.SHIPPED_APP_IMAGE: images.app},
        ports,
    )
    path = tmp_path / "runq-sidecar.played.yaml"
    path.write_text(text, encoding="utf-8")
    secrets = {"api-key": os.urandom(32).hex(), "seal-key": generate_key()}
    with machine_lock("pod"):
        remove_played(path)
        try:
            create_secrets(secrets)
            podman("kube", "play", path)
            yield {"ports": ports, "secrets": secrets, "pod": pod_name(), "path": path}
        finally:
            write_excerpt(pod_name())
            remove_played(path)


def write_excerpt(pod: str) -> None:
    """Both containers' logs interleaved by time, for the docs and the failure report."""
    lines = []
    for ctr in ("app", "runq"):
        done = run(["podman", "logs", "--timestamps", f"{pod}-{ctr}"], check=False)
        for line in (done.stdout + done.stderr).splitlines():
            stamp, _, message = line.partition(" ")
            lines.append((sortable(stamp), f"{ctr:4} | {message}"))
    EXCERPT.parent.mkdir(parents=True, exist_ok=True)
    lines.sort(key=lambda line: line[0])  # stable: equal stamps keep their order
    EXCERPT.write_text("\n".join(text for _, text in lines) + "\n", encoding="utf-8")


def sortable(stamp: str) -> str:
    """RFC 3339 with nanoseconds, trailing zeros trimmed: padded so text order is time order."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return f"{whole}.{fraction:0<9}"


def app_url(played: dict[str, Any], path: str) -> str:
    return f"http://127.0.0.1:{played['ports'][8080]}{path}"


def wait_run(played: dict[str, Any], run_id: str, *statuses: str) -> dict[str, Any]:
    """The run as runq sees it, asked through the application (which asks runq)."""

    def fetch() -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(app_url(played, f"/runs/{run_id}"), timeout=10).json()
        return body

    return wait_run_status(fetch, statuses, lambda: pod_logs(played))


def pod_logs(played: dict[str, Any]) -> str:
    return "\n".join(f"--- {c}\n{logs(played['pod'] + '-' + c)}" for c in ("app", "runq"))


def render(played: dict[str, Any], document: str, seconds: float = 0) -> str:
    response = httpx.post(
        app_url(played, f"/documents/{document}/render"), json={"seconds": seconds}, timeout=10
    )
    assert response.status_code == 202, response.text
    return str(response.json()["run_id"])


def test_sidecar_pod_renders_through_runq_and_drains(played: dict[str, Any]) -> None:
    pod, ports = played["pod"], played["ports"]
    runq_ctr = f"{pod}-runq"
    wait_for_sync(
        lambda: (
            answers(f"http://127.0.0.1:{ports[7777]}/readyz") == 200
            and answers(app_url(played, "/healthz")) == 200
        ),
        timeout=START_TIMEOUT,
        interval=0.2,
        message=f"the pod never became ready\n{pod_logs(played)}",
    )

    # The probes, as the manifest writes them, run inside the runq container.
    spec = manifest.container("runq")
    assert run(["podman", "healthcheck", "run", runq_ctr], check=False).returncode == 0
    readiness = spec["readinessProbe"]["exec"]["command"]
    assert run(["podman", "exec", runq_ctr, *readiness], check=False).returncode == 0

    # Scraping: the annotated port and path answer without credentials.
    annotations = manifest.deployment()["spec"]["template"]["metadata"]["annotations"]
    scrape_port = ports[int(annotations["prometheus.io/port"])]
    metrics = httpx.get(f"http://127.0.0.1:{scrape_port}{annotations['prometheus.io/path']}")
    assert metrics.status_code == 200
    assert "runq_runs" in metrics.text

    # app -> runq (submit) -> app (callback on the pod's loopback) -> completed.
    first = render(played, "Q3-report")
    done = wait_run(played, first, "completed", "failed")
    assert done["status"] == "completed", done
    assert done["answer"]["html"] == "<h1>Q3-report</h1>"
    assert done["answer"]["rendered_by"] == pod

    # SIGTERM to the pod while a render is in flight: runq drains and finishes it, the
    # app keeps its callback port open until runq has exited, both exit 0.
    slow = render(played, "annual-report", seconds=3)
    wait_run(played, slow, "running")
    podman("pod", "stop", "--time", str(GRACE), pod, timeout=GRACE + 30)
    assert exit_code(runq_ctr) == 0, pod_logs(played)
    assert exit_code(f"{pod}-app") == 0, pod_logs(played)
    app_events = [json.loads(line) for line in logs(f"{pod}-app").splitlines() if line[:1] == "{"]
    assert {"app": "stopped", "runq_still_up": False} in app_events, pod_logs(played)

    # The run's row on the runq-data volume, read with the host's runq CLI.
    (claim,) = manifest.claim_names()
    mountpoint = podman("volume", "inspect", "--format", "{{.Mountpoint}}", claim).strip()
    store = {
        "RUNQ_STORE_URL": f"sqlite:///{mountpoint}/runq.db",
        "RUNQ_SEAL_KEYS": "env:RUNQ_SEAL_KEY",
        "RUNQ_SEAL_KEY": played["secrets"]["seal-key"],
    }
    shown = show_run(slow, store)
    assert (shown["status"], shown["attempt"]) == ("completed", 1), shown
    write_excerpt(pod)
    print(f"\n--- sidecar pod log ({EXCERPT})\n{EXCERPT.read_text(encoding='utf-8')}")
