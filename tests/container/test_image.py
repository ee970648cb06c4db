"""runq's image, built and started: non-root, read-only, on SQLite and on PostgreSQL,
answering its probes, running runs, and draining on ``podman stop`` (SIGTERM).

The drain rules (docs/design.md, "Drain"; docs/operations.md, "Shutdown and restart"):
a run that finishes within ``stop_timeout_seconds`` completes; one still executing then
is interrupted once and, with attempts left, returns to ``queued``. Both are shown here,
one per engine. Each container runs with ``--read-only`` and exactly the writable
storage the docs tell operators to give it: the ``/var/lib/runq`` volume on SQLite,
nothing at all on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import PG_URL, drop_schema, new_schema_name, require_postgres

from container.images import Images
from container.podman import TEST_PREFIX, podman, podman_json, removed_afterwards, run
from container.runq_container import show_run, start_runq, stop_with_run_in_flight
from runq.seal import generate_key

# xdist_group: one worker builds the images and runs these while the others go on with the
# suite. pytest 9.2 with pytest-xdist 3.8 ignores the group (xdist renames item._nodeid,
# which pytest 9.2 no longer reads), so a second worker may wait on the build lock instead.
pytestmark = [pytest.mark.daemon, pytest.mark.timeout(600), pytest.mark.xdist_group("container")]

RUNQ_UID = 10001


def unique(prefix: str) -> str:
    return f"{prefix}-{os.urandom(4).hex()}"


@pytest.fixture
def pg_schema_sync() -> Iterator[str]:
    require_postgres()
    schema = new_schema_name()
    yield schema
    asyncio.run(drop_schema(schema))


def in_container(name: str, script: str) -> int:
    return run(["podman", "exec", name, "sh", "-c", script], check=False).returncode


def test_image_is_non_root_with_probe_and_drain_settings(
    images: Images, record_property: Callable[[str, object], None]
) -> None:
    (info,) = podman_json("image", "inspect", images.runq)
    config = info["Config"]
    assert config["User"] == f"{RUNQ_UID}:{RUNQ_UID}"
    assert config["Entrypoint"] == ["runq"]
    assert config["Cmd"] == ["serve"]
    assert config["StopSignal"] == "SIGTERM"
    assert "/var/lib/runq" in config["Volumes"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["RUNQ_HTTP_AUTH"] == "key"
    assert "RUNQ_API_KEY" not in env, "the API key is a run-time secret"
    assert info["Healthcheck"]["Test"] == ["CMD", "runq-probe", "/readyz"]
    size = int(info["Size"])
    (base,) = podman_json("image", "inspect", images.base)
    record_property(
        "measured",
        f"runq image {images.runq}: {size / 1e6:.0f} MB"
        f" (base {images.base}: {int(base['Size']) / 1e6:.0f} MB)",
    )
    if images.built:
        steps = ", ".join(f"{step} {seconds:.0f} s" for step, seconds in images.built.items())
        record_property("measured", f"container images built now: {steps}")
    # What keeps the image small: no wheelhouse layer, no pip. Generous bounds catch a
    # regression (a copied checkout, a dev dependency), not the odd megabyte.
    assert size < 400e6, f"runq image is {size / 1e6:.0f} MB"


def test_sqlite_read_only_runs_and_drains_to_completion(images: Images, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    os.chown(data, RUNQ_UID, RUNQ_UID)  # a bind mount keeps the host's owner (docs)
    name = unique(f"{TEST_PREFIX}sqlite")
    with removed_afterwards(name):
        runq = start_runq(images.runq, name, env={}, options=[f"--volume={data}:/var/lib/runq"])
        assert runq.get("/healthz", auth=False).status_code == 200
        assert runq.get("/readyz", auth=False).json()["status"] == "ready"
        assert "runq_runs" in runq.get("/metrics", auth=False).text
        assert runq.get("/queue/stats", auth=False).status_code == 401

        # Non-root, read-only root, no pip and no wheelhouse in the image.
        assert podman("exec", name, "id", "-u").strip() == str(RUNQ_UID)
        probe = podman("exec", name, "sh", "-c", "touch /opt/runq/x 2>&1 || true")
        assert "Read-only file system" in probe
        assert in_container(name, "test ! -e /wheels && test ! -e /opt/runq/bin/pip") == 0
        assert in_container(name, "runq-probe /readyz") == 0
        assert in_container(name, "runq-probe /no-such-path") == 1

        echo = runq.submit("task/echo", {"hello": "container"})
        assert runq.wait_status(echo, "completed")["answer"] == {"hello": "container"}

        # In flight when SIGTERM comes, shorter than the drain: it completes.
        slow, drained = stop_with_run_in_flight(runq, seconds=3)
        assert drained["stragglers"] == 0

    # The database and its key file live on the volume, owned by the runq user.
    assert {p.name for p in data.iterdir()} >= {"runq.db", "runq.db.key"}
    assert all(p.stat().st_uid == RUNQ_UID for p in data.iterdir())
    store = {"RUNQ_STORE_URL": f"sqlite:///{data / 'runq.db'}"}
    run = show_run(slow, store)
    assert (run["status"], run["attempt"]) == ("completed", 1)


def test_postgres_read_only_without_volume_requeues_on_drain(
    images: Images, pg_schema_sync: str
) -> None:
    key = generate_key()
    store = {
        "RUNQ_STORE_URL": PG_URL,
        "RUNQ_STORE_SCHEMA": pg_schema_sync,
        "RUNQ_SEAL_KEYS": "env:RUNQ_SEAL_KEY",
        "RUNQ_SEAL_KEY": key,
    }
    settings = {"RUNQ_QUEUE_MAX_ATTEMPTS": "3", "RUNQ_QUEUE_STOP_TIMEOUT_SECONDS": "1"}
    name = unique(f"{TEST_PREFIX}pg")
    with removed_afterwards(name):
        # --image-volume=ignore: not even the image's /var/lib/runq volume; on
        # PostgreSQL runq writes nothing to disk.
        runq = start_runq(
            images.runq, name, env={**store, **settings}, options=["--image-volume=ignore"]
        )
        ready = runq.get("/readyz", auth=False).json()
        assert ready["status"] == "ready"

        echo = runq.submit("task/echo", {"engine": "postgres"})
        assert runq.wait_status(echo, "completed")["answer"] == {"engine": "postgres"}

        # Still executing when the 1 s drain ends: interrupted once, attempts left, so it
        # goes back to the queue for any replica.
        long, drained = stop_with_run_in_flight(runq, seconds=120)
        assert drained["stragglers"] == 1

    run = show_run(long, store)
    assert run["status"] == "queued", run
    assert run["attempt"] == 1
    assert run["max_attempts"] == 3
