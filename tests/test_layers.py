"""The layering of ``runq`` is an executable contract: ``lint-imports`` checks the
``[tool.importlinter]`` contracts of pyproject.toml, so an upward import fails the suite.

Two more checks keep the contract honest. It is exactly as tight as the real imports:
each top-level package or module sits one layer above the highest thing it imports
(so every one of them imports something in the layer right below it, and nothing is
declared above a layer it does not need), and modules of one layer never import each
other. And docs/INTERNALS.md draws the same layers, in the same order."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
INTERNALS = ROOT / "docs" / "INTERNALS.md"


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


def declared_layers() -> list[list[str]]:
    """The layers contract, top first, each layer's modules without the ``runq.`` prefix."""
    data = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))
    layers: list[str] = data["tool"]["importlinter"]["contracts"][0]["layers"]
    return [
        sorted(m.strip().removeprefix("runq.") for m in re.split(r"[|:]", layer))
        for layer in layers
    ]


def top_level_imports() -> dict[str, set[str]]:
    """Each top-level package or module of runq and the others it imports (TYPE_CHECKING
    imports included: an annotation is a dependency too)."""
    graph = grimp.build_graph("runq", cache_dir=None)
    deps: dict[str, set[str]] = {}
    for module in graph.modules:
        parts = module.split(".")
        if len(parts) < 2 or parts[1] == "__main__":
            continue
        found = deps.setdefault(parts[1], set())
        for imported in graph.find_modules_directly_imported_by(module):
            other = imported.split(".")
            if len(other) > 1 and other[1] != parts[1]:
                found.add(other[1])
    return deps


def tightest_layers(deps: dict[str, set[str]]) -> list[list[str]]:
    """Each module one layer above the highest module it imports (the ground: none), top
    first. A cycle between top-level modules has no layering and fails here."""
    level: dict[str, int] = {}

    def of(name: str, path: tuple[str, ...] = ()) -> int:
        if name in path:
            raise AssertionError(f"import cycle: {' -> '.join((*path, name))}")
        if name not in level:
            level[name] = 1 + max((of(d, (*path, name)) for d in deps[name]), default=-1)
        return level[name]

    for name in deps:
        of(name)
    return [sorted(n for n in deps if level[n] == h) for h in range(max(level.values()), -1, -1)]


def test_the_layers_are_exactly_as_tight_as_the_imports() -> None:
    assert declared_layers() == tightest_layers(top_level_imports()), (
        "pyproject.toml's layers differ from the real imports: declare each module one layer "
        "above the highest one it imports (and update docs/INTERNALS.md's diagram)"
    )


def test_the_tightness_check_sees_a_module_declared_too_high() -> None:
    deps = {"api": {"store"}, "store": {"model"}, "model": set(), "log": set()}
    assert tightest_layers(deps) == [["api"], ["store"], ["log", "model"]]
    with pytest.raises(AssertionError, match="cycle"):
        tightest_layers({"a": {"b"}, "b": {"a"}})


def diagram_layers(text: str) -> list[list[str]]:
    """The layers drawn in the first ``text`` block after "## Layers", top first."""
    section = text.split("## Layers", 1)[1]
    block = section.split("```text\n", 1)[1].split("```", 1)[0]
    rows = [row.split("(", 1)[0].strip() for row in block.splitlines()]
    return [sorted(m.strip() for m in re.split(r"[|:]", row)) for row in rows if row]


def test_internals_draws_the_declared_layers() -> None:
    assert diagram_layers(INTERNALS.read_text(encoding="utf-8")) == declared_layers()
