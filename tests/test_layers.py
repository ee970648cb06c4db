"""The layering of ``runq`` is an executable contract: ``lint-imports`` checks the
``[tool.importlinter]`` contracts of pyproject.toml, so an upward import fails the suite."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"


def _lint_imports() -> str:
    beside_python = Path(sys.executable).parent / "lint-imports"
    found = str(beside_python) if beside_python.exists() else shutil.which("lint-imports")
    if found is None:
        pytest.fail("lint-imports is not installed (pip install -e '.[dev]')")
    return found


def _run(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_lint_imports(), "--no-cache", "--no-logo", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_import_contracts_are_kept() -> None:
    result = _run(PYPROJECT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_breaks_the_contract(tmp_path: Path) -> None:
    """The contract checks something: with the queue placed below the worker core (which
    the queue imports), the same linter reports a broken contract."""
    data = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    contract = data["tool"]["importlinter"]["contracts"][0]
    layers: list[str] = contract["layers"]
    queue, worker = layers.index("runq.queue"), layers.index("runq.worker | runq.maintenance")
    layers[queue], layers[worker] = layers[worker], layers[queue]
    quoted = ", ".join(f'"{layer}"' for layer in layers)
    config = tmp_path / "swapped.toml"
    config.write_text(
        '[tool.importlinter]\nroot_package = "runq"\n\n'
        '[[tool.importlinter.contracts]]\nname = "swapped"\ntype = "layers"\n'
        f"layers = [{quoted}]\n",
        encoding="utf-8",
    )
    result = _run(config)
    assert result.returncode != 0
    assert "runq.queue" in result.stdout
