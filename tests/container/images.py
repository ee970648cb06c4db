"""The images the container tests run: built with the shipped scripts, once, and cached
under a hash of their inputs so that a second run (or CI after a session) builds nothing.

- base: ``packaging/container/build-base`` (mmdebstrap of Debian bookworm + python3,
  ``podman import``). Key: the script's text. The tarball stays in the cache directory,
  so even a machine whose podman storage was wiped skips mmdebstrap.
- runq: ``build-wheelhouse`` pinned to this environment's versions (what the suite tests),
  then ``build-image --wheelhouse`` with no network. Key: the base image's id, runq's
  sources, the packaging files and the pins.
- app: ``packaging/kubernetes/example-app`` on the same base. Key: the base's id and the
  app's files.

Images are tagged ``localhost/runq-test-*:<key>``. The cache directory is
``RUNQ_CONTAINER_CACHE``, else ``~/.cache/runq-container``. A lock file there serialises
builds across xdist workers and checkouts sharing the machine; test images and tarballs
unused for a week are removed by the next build; ``builds.log`` there records how long
each build step took.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from container.podman import image_exists, image_id, podman, podman_json, run

ROOT = Path(__file__).resolve().parents[2]
PACKAGING = ROOT / "packaging" / "container"
BUILD_BASE = PACKAGING / "build-base"
BUILD_IMAGE = PACKAGING / "build-image"
BUILD_WHEELHOUSE = PACKAGING / "build-wheelhouse"
APP_DIR = ROOT / "packaging" / "kubernetes" / "example-app"
CACHE = Path(os.environ.get("RUNQ_CONTAINER_CACHE") or Path.home() / ".cache" / "runq-container")
STALE_SECONDS = 7 * 86400
BUILD_TIMEOUT = 600.0
_PIN = re.compile(r"^[A-Za-z0-9_.-]+==[^\s;]+$")


@dataclass
class Images:
    base: str
    runq: str
    app: str
    #: Seconds each step took in this process; a cached step is absent.
    built: dict[str, float] = field(default_factory=dict)


@contextlib.contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """A lock every test run on this machine shares (xdist workers, other checkouts)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def digest(parts: Iterable[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()[:16]


def files_under(*roots: Path) -> list[Path]:
    found: list[Path] = []
    for root in roots:
        if root.is_file():
            found.append(root)
            continue
        found.extend(
            p
            for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        )
    return sorted(found)


def file_parts(paths: Iterable[Path]) -> Iterator[bytes]:
    for path in paths:
        yield str(path.relative_to(ROOT)).encode()
        yield path.read_bytes()


def pins() -> str:
    """This environment's versions as pip constraints (runq itself and URLs left out)."""
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    lines = [line.strip() for line in frozen.splitlines()]
    return "\n".join(
        line for line in lines if _PIN.match(line) and not line.lower().startswith("runq==")
    )


def ensure_base(built: dict[str, float]) -> str:
    key = digest([BUILD_BASE.read_bytes()])
    tag = f"localhost/runq-test-base:{key}"
    if not image_exists(tag):
        started = time.monotonic()
        tarball = CACHE / f"base-{key}.tar"
        step = "base (import cached tarball)" if tarball.exists() else "base (mmdebstrap)"
        if tarball.exists():
            tarball.touch()  # in use: not stale
        run([BUILD_BASE, "--tag", tag, "--tarball", tarball], timeout=BUILD_TIMEOUT)
        built[step] = time.monotonic() - started
    return tag


def ensure_runq(base: str, built: dict[str, float]) -> str:
    pinned = pins()
    sources = files_under(
        ROOT / "runq",
        ROOT / "pyproject.toml",
        ROOT / "README.md",
        PACKAGING / "Containerfile",
        PACKAGING / "runq_probe.py",
        BUILD_IMAGE,
        BUILD_WHEELHOUSE,
    )
    key = digest([image_id(base).encode(), pinned.encode(), *file_parts(sources)])
    tag = f"localhost/runq-test:{key}"
    if image_exists(tag):
        return tag
    with tempfile.TemporaryDirectory(prefix="runq-wheelhouse-") as scratch:
        constraints = Path(scratch) / "constraints.txt"
        constraints.write_text(pinned + "\n", encoding="utf-8")
        wheelhouse = Path(scratch) / "wheels"
        env_python = {"PYTHON": sys.executable}
        started = time.monotonic()
        _run_with(env_python, [BUILD_WHEELHOUSE, wheelhouse, "--constraint", constraints])
        built["wheelhouse (pip wheel)"] = time.monotonic() - started
        started = time.monotonic()
        run(
            [BUILD_IMAGE, "--base", base, "--tag", tag, "--wheelhouse", wheelhouse],
            timeout=BUILD_TIMEOUT,
        )
        built["runq image (podman build, no network)"] = time.monotonic() - started
    return tag


def _run_with(extra_env: dict[str, str], argv: list[str | Path]) -> None:
    done = subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        env={**os.environ, **extra_env},
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"{argv[0]} exited {done.returncode}\n{done.stderr[-4000:]}")


def ensure_app(base: str, built: dict[str, float]) -> str:
    key = digest([image_id(base).encode(), *file_parts(files_under(APP_DIR))])
    tag = f"localhost/runq-test-app:{key}"
    if not image_exists(tag):
        started = time.monotonic()
        podman(
            "build", "--network=none", "--format", "docker", "--layers=false",
            "--build-arg", f"BASE_IMAGE={base}", "-t", tag, APP_DIR,
            timeout=BUILD_TIMEOUT,
        )  # fmt: skip
        built["app image"] = time.monotonic() - started
    return tag


def remove_stale(keep: set[str]) -> None:
    """Test images and base tarballs older than a week: a new key per change otherwise
    fills the disk. An image a container still uses is refused by podman and stays."""
    cutoff = time.time() - STALE_SECONDS
    for image in podman_json("images", "--format", "json"):
        for name in image.get("Names") or []:
            ours = name.startswith("localhost/runq-test") and name not in keep
            if ours and int(image.get("Created", 0)) < cutoff:
                podman("rmi", name, check=False)
    keys = {name.rpartition(":")[2] for name in keep}
    for tarball in CACHE.glob("base-*.tar"):
        if tarball.stem.removeprefix("base-") not in keys and tarball.stat().st_mtime < cutoff:
            tarball.unlink(missing_ok=True)


def ensure_images() -> Images:
    """Every image the tests need, built where missing (under the machine-wide lock)."""
    built: dict[str, float] = {}
    with machine_lock("build"):
        base = ensure_base(built)
        images = Images(
            base=base, runq=ensure_runq(base, built), app=ensure_app(base, built), built=built
        )
        if built:
            remove_stale({images.base, images.runq, images.app})
            record(built)
    return images


def record(built: dict[str, float]) -> None:
    """One line per build in the cache's builds.log: what a cold build costs, over time."""
    steps = ", ".join(f"{step} {seconds:.0f} s" for step, seconds in built.items())
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    with open(CACHE / "builds.log", "a", encoding="utf-8") as log:
        log.write(f"{stamp} UTC  {steps}; total {sum(built.values()):.0f} s\n")
