"""The sidecar manifest, the probe and the container docs agree with runq, without podman.

These run everywhere; tests/container/test_pod.py plays the same file for real.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from container import manifest
from runq.config import load_config
from runq.config.http import split_listen

ROOT = manifest.ROOT
CONTAINERFILE = ROOT / "packaging" / "container" / "Containerfile"
PROBE = ROOT / "packaging" / "container" / "runq_probe.py"
APP = ROOT / "packaging" / "kubernetes" / "example-app" / "app.py"
OPERATIONS = ROOT / "docs" / "operations.md"


def load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def image_env() -> dict[str, str]:
    """The ENV of the Containerfile's final stage."""
    text = CONTAINERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    final = text.rsplit("\nFROM ", 1)[1]
    env: dict[str, str] = {}
    for line in final.splitlines():
        if line.startswith("ENV "):
            env.update(item.split("=", 1) for item in shlex.split(line[4:]))
    return env


def runq_config(tmp_path: Path) -> Any:
    """The config runq starts with in the pod: the image's environment, the container's
    environment, the Secret's values, and the ConfigMap's file."""
    (config_map,) = manifest.of_kind("ConfigMap")
    runq = manifest.container("runq")
    env = {**image_env(), **manifest.plain_env(runq)}
    mount = next(m for m in runq["volumeMounts"] if m["name"] == config_map["metadata"]["name"])
    file_name = Path(env["RUNQ_CONFIG"])
    assert file_name.parent == Path(mount["mountPath"])
    local = tmp_path / file_name.name
    local.write_text(config_map["data"][file_name.name], encoding="utf-8")
    secrets = {"RUNQ_API_KEY": "k" * 64, "RUNQ_SEAL_KEY": "unused-by-load_config"}
    return load_config(local, environ={**env, **secrets})


def test_documents_podman_can_play_in_order() -> None:
    kinds = [doc["kind"] for doc in manifest.documents()]
    # podman kube play reads a ConfigMap only when it comes before the pod using it.
    assert kinds == ["ConfigMap", "PersistentVolumeClaim", "Deployment"]


def test_one_sqlite_replica_replaced_not_rolled() -> None:
    spec = manifest.deployment()["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"]["type"] == "Recreate"
    (claim,) = manifest.claim_names()
    (pvc,) = manifest.of_kind("PersistentVolumeClaim")
    assert pvc["metadata"]["name"] == claim
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_containers_run_non_root_read_only_without_privileges() -> None:
    pod = manifest.deployment()["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["fsGroup"] == 10001
    uids = set()
    for name in ("app", "runq"):
        context = manifest.container(name)["securityContext"]
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        uids.add(context["runAsUser"])
    assert manifest.container("runq")["securityContext"]["runAsUser"] == 10001
    assert len(uids) == 2, "the app and runq run as different users"


def test_runq_mounts_what_the_image_writes_and_reads() -> None:
    runq = manifest.container("runq")
    mounts = {m["name"]: m for m in runq["volumeMounts"]}
    (claim,) = manifest.claim_names()
    assert mounts[claim]["mountPath"] == "/var/lib/runq"  # the image's VOLUME
    assert image_env()["RUNQ_STORE_URL"] == "sqlite:////var/lib/runq/runq.db"
    assert mounts["runq-config"]["readOnly"] is True
    assert runq["image"] == manifest.SHIPPED_RUNQ_IMAGE
    assert manifest.container("app")["image"] == manifest.SHIPPED_APP_IMAGE


def test_secrets_come_from_the_secret_only() -> None:
    assert manifest.secret_refs() == {"runq": {"api-key", "seal-key"}}
    for name in ("app", "runq"):
        env = manifest.plain_env(manifest.container(name))
        assert not any("KEY" in key for key in env), f"{name} has a key in plain text"
    app_refs = [e["name"] for e in manifest.container("app")["env"] if "valueFrom" in e]
    assert app_refs == ["RUNQ_API_KEY"], "the app gets the API key, never the seal key"


def test_probes_are_exec_runq_probe() -> None:
    runq = manifest.container("runq")
    assert runq["livenessProbe"]["exec"]["command"] == ["runq-probe", "/healthz"]
    assert runq["readinessProbe"]["exec"]["command"] == ["runq-probe", "/readyz"]
    assert "runq_probe.py /usr/local/bin/runq-probe" in CONTAINERFILE.read_text(encoding="utf-8")


def test_ports_agree_from_app_to_runq_to_scraper(tmp_path: Path) -> None:
    config = runq_config(tmp_path)
    runq, app = manifest.container("runq"), manifest.container("app")
    runq_port = config.http.host_port[1]
    assert [p["containerPort"] for p in runq["ports"]] == [runq_port]
    annotations = manifest.deployment()["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert int(annotations["prometheus.io/port"]) == runq_port
    app_env = manifest.plain_env(app)
    assert app_env["RUNQ_URL"] == f"http://127.0.0.1:{runq_port}"
    # runq calls the app back on the pod's loopback, on the app's callback listener.
    component = config.components["task/render"]
    assert component["kind"] == "http"
    assert component["url"] == f"http://{app_env['APP_CALLBACK_LISTEN']}/render"
    assert app_env["APP_CALLBACK_LISTEN"].startswith("127.0.0.1:")
    assert [p["containerPort"] for p in app["ports"]] == [split_listen(app_env["APP_LISTEN"])[1]]


def test_grace_covers_the_drain_and_the_app_outwaits_runq(tmp_path: Path) -> None:
    config = runq_config(tmp_path)
    grace = manifest.deployment()["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert config.queue.effective_stop_timeout + 10 <= grace
    app = load_module(APP, "runq_example_app")
    assert config.queue.effective_stop_timeout < app.DRAIN_SECONDS < grace
    assert config.seal.keys == ("env:RUNQ_SEAL_KEY",)


def test_probe_reads_the_listen_address_as_runq_does(tmp_path: Path) -> None:
    probe = load_module(PROBE, "runq_probe")
    config = tmp_path / "runq.toml"
    config.write_text('[http]\nlisten = "0.0.0.0:9001"\n', encoding="utf-8")
    assert probe.listen_address({}) == "127.0.0.1:7777"
    assert probe.listen_address({"RUNQ_CONFIG": str(config)}) == "0.0.0.0:9001"
    both = {"RUNQ_CONFIG": str(config), "RUNQ_HTTP_LISTEN": "127.0.0.1:9002"}
    assert probe.listen_address(both) == "127.0.0.1:9002"
    assert probe.probe_url("0.0.0.0:9001", "/readyz") == "http://127.0.0.1:9001/readyz"
    assert probe.probe_url("[::]:9001", "/healthz") == "http://[::1]:9001/healthz"
    assert probe.probe_url("10.0.0.5:7777", "/readyz") == "http://10.0.0.5:7777/readyz"


@pytest.mark.parametrize("argument", ["readyz", "http://elsewhere/"])
def test_probe_refuses_what_is_not_a_path(argument: str) -> None:
    done = subprocess.run(
        [sys.executable, PROBE, argument],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ.get("PATH", "")},
        check=False,
    )
    assert done.returncode == 2
    assert "is not a path" in done.stderr


def container_section() -> str:
    text = OPERATIONS.read_text(encoding="utf-8")
    return text.split("## 2. As a container", 1)[1].split("\n## 3. ", 1)[0]


def test_operations_guide_names_what_ships() -> None:
    section = container_section()
    for script in ("build-base", "build-wheelhouse", "build-image"):
        path = ROOT / "packaging" / "container" / script
        assert f"packaging/container/{script}" in section
        assert os.access(path, os.X_OK), f"{path} is not executable"
    assert "packaging/kubernetes/runq-sidecar.yaml" in section
    assert "packaging/kubernetes/example-app" in section
    # The pod run's log in the guide shows the drain as test_pod.py asserts it.
    excerpt = section.split("```text", 1)[1].split("```", 1)[0]
    order = ['"daemon.draining","in_flight":1', '"render.finished"', '"stragglers":0']
    positions = [excerpt.rindex(event) for event in order]
    assert positions == sorted(positions), "the excerpt no longer shows the drain in order"
    assert excerpt.rstrip().endswith('{"app": "stopped", "runq_still_up": false}')


def test_sandbox_workarounds_are_documented_as_what_the_tests_set() -> None:
    section = container_section()
    conf = (ROOT / "tests" / "container" / "sandbox-containers.conf").read_text(encoding="utf-8")
    assert 'runtime = "runc"' in conf
    assert 'default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]' in conf
    assert "--runtime runc" in section
    assert "--ulimit nofile=1024:1024 --ulimit nproc=1024:1024" in section
    assert "not requirements" in section
