"""No module of runq imports another module's private name (``_name``): what a module
shares is public, and what it keeps to itself can change without breaking another."""

from __future__ import annotations

import ast
from pathlib import Path

import runq

PACKAGE = Path(runq.__file__).parent


def private_imports(source: str) -> list[tuple[int, str]]:
    """(line, what) for each import of a ``_private`` module or name of runq."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("runq"):
            module = node.module or ""
            if any(part.startswith("_") for part in module.split(".")):
                found.append((node.lineno, module))
            found += [
                (node.lineno, f"{module}.{alias.name}")
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")
            ]
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, alias.name)
                for alias in node.names
                if alias.name.startswith("runq")
                and any(part.startswith("_") for part in alias.name.split("."))
            ]
    return found


def test_no_module_imports_a_private_name() -> None:
    offenders = {
        str(path.relative_to(PACKAGE.parent)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if (hits := private_imports(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}, f"imports of private names: {offenders}"


def test_the_check_sees_each_way_of_importing_a_private_name() -> None:
    source = (
        "from runq.store.base import _helper\n"
        "from runq.client import _core\n"
        "import runq.sidecar._common\n"
        "from runq.model import Run, __version__\n"
        "from other import _fine\n"
    )
    assert private_imports(source) == [
        (1, "runq.store.base._helper"),
        (2, "runq.client._core"),
        (3, "runq.sidecar._common"),
    ]
