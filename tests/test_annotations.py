"""No ``Any`` stands where a runq type or a database driver's type belongs: a store, a
queue, a connection, a pool, a row or a record is annotated as what it is, so mypy
--strict checks the calls on it and a reader sees what travels where.

The check reads every annotation in runq/ and flags ``Any`` (bare, or as the item of a
list or sequence) on a name whose role is one of those objects. ``Any`` stays right for
what is really any value: a payload, a decision, a JSON body."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import runq

PACKAGE = Path(runq.__file__).parent

#: Names that hold a runq object or a driver object wherever they appear.
TYPED_ROLES = re.compile(
    r"^_?(con|conn|connection|db|pool|claims|record|row|found|store|queue|q|listener"
    r"|notifier|notifications|sealer|runtime|transport|executor|claimer|hub|feed)$"
)
#: An annotation that says nothing: Any, or a list/sequence of Any.
VAGUE = re.compile(r"^(Any|(list|Sequence|Iterable)\[Any\])( \| None)?$")


def vague_annotations(source: str) -> list[tuple[int, str, str]]:
    """(line, name, annotation) for each vague annotation on a typed role."""
    found: list[tuple[int, str, str]] = []

    def check(name: str, annotation: ast.expr | None, line: int) -> None:
        if annotation is None:
            return
        text = ast.unparse(annotation)
        if TYPED_ROLES.match(name.rsplit(".", 1)[-1]) and VAGUE.match(text):
            found.append((line, name, text))

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                check(arg.arg, arg.annotation, arg.lineno)
        elif isinstance(node, ast.AnnAssign):
            check(ast.unparse(node.target), node.annotation, node.lineno)
    return found


def test_no_any_stands_for_a_runq_or_driver_type() -> None:
    offenders = {
        str(path.relative_to(PACKAGE.parent)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if (hits := vague_annotations(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}, f"Any where a runq or driver type belongs: {offenders}"


def test_the_check_flags_an_untyped_connection_and_leaves_a_payload_alone() -> None:
    source = (
        "async def write(con: Any, payload: Any) -> None: ...\n"
        "class S:\n"
        "    pool: Any | None = None\n"
        "    found: list[Any] = []\n"
        "    rows_seen: list[Any] = []\n"
    )
    assert vague_annotations(source) == [
        (1, "con", "Any"),
        (3, "pool", "Any | None"),
        (4, "found", "list[Any]"),
    ]
