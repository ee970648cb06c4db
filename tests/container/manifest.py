"""packaging/kubernetes/runq-sidecar.yaml read as data, and the copy of it a test plays."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "packaging" / "kubernetes" / "runq-sidecar.yaml"
#: The image names the shipped file uses, which a test replaces with the ones it built.
SHIPPED_RUNQ_IMAGE = "localhost/runq:latest"
SHIPPED_APP_IMAGE = "localhost/runq-example-app:latest"
#: The ports the pod declares. podman kube play publishes every declared containerPort
#: on the host (Kubernetes does not), so a test moves them to free ones.
SHIPPED_PORTS = (7777, 8080)


def documents(text: str | None = None) -> list[dict[str, Any]]:
    loaded = yaml.safe_load_all(MANIFEST.read_text(encoding="utf-8") if text is None else text)
    return [doc for doc in loaded if doc]


def of_kind(kind: str, docs: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    return [doc for doc in (documents() if docs is None else docs) if doc["kind"] == kind]


def deployment(docs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    (found,) = of_kind("Deployment", docs)
    return found


def container(name: str, docs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    containers = deployment(docs)["spec"]["template"]["spec"]["containers"]
    (found,) = [c for c in containers if c["name"] == name]
    return found


def plain_env(container_spec: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: str(e["value"]) for e in container_spec.get("env", []) if "value" in e}


def secret_refs(docs: list[dict[str, Any]] | None = None) -> dict[str, set[str]]:
    """Secret name -> the keys the pod reads from it."""
    refs: dict[str, set[str]] = {}
    for spec in deployment(docs)["spec"]["template"]["spec"]["containers"]:
        for entry in spec.get("env", []):
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                refs.setdefault(ref["name"], set()).add(ref["key"])
    return refs


def claim_names(docs: list[dict[str, Any]] | None = None) -> list[str]:
    volumes = deployment(docs)["spec"]["template"]["spec"]["volumes"]
    return [
        v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v
    ]


def volume_names(docs: list[dict[str, Any]] | None = None) -> list[str]:
    """The podman volumes playing the file creates: one per claim and per ConfigMap."""
    names = []
    for volume in deployment(docs)["spec"]["template"]["spec"]["volumes"]:
        if "persistentVolumeClaim" in volume:
            names.append(volume["persistentVolumeClaim"]["claimName"])
        if "configMap" in volume:
            names.append(volume["configMap"]["name"])
    return names


def substituted(images: dict[str, str], ports: dict[int, int]) -> str:
    """The shipped file with only image names and port numbers replaced, and a check
    that nothing else changed: every changed line turns back into the shipped line."""
    shipped = MANIFEST.read_text(encoding="utf-8")
    text = shipped
    for old, new in images.items():
        assert old in text, f"{old} is not in {MANIFEST.name}"
        text = text.replace(old, new)
    for old_port, new_port in ports.items():
        text = re.sub(rf"\b{old_port}\b", str(new_port), text)
    for played, original in zip(text.splitlines(), shipped.splitlines(), strict=True):
        back = played
        for old, new in images.items():
            back = back.replace(new, old)
        for old_port, new_port in ports.items():
            back = re.sub(rf"\b{new_port}\b", str(old_port), back)
        assert back == original, f"substitution changed more than images/ports: {played!r}"
    return text
