"""SQL text lives in the engines' statements packages and the migrations, nowhere else:
a reader looking for a statement finds it there, and a verb cannot grow its own SQL."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import runq

PACKAGE = Path(runq.__file__).parent
SQL = re.compile(r"\bSELECT\b|\bINSERT INTO\b|\bUPDATE\b .*\bSET\b|\bDELETE FROM\b|\bPRAGMA\b")
#: Each engine's statement texts, one module per concern (runs, claims, limits, ...).
ENGINE_STATEMENTS = {
    engine: frozenset((PACKAGE / "store" / engine / "statements").glob("*.py"))
    for engine in ("sqlite", "postgres")
}
#: The engine-neutral SQL: fragments both dialects spell alike, and run listings.
NEUTRAL = {PACKAGE / "store" / "statements.py", PACKAGE / "store" / "listing_sql.py"}
ALLOWED = NEUTRAL.union(*ENGINE_STATEMENTS.values())
#: Outside the statements modules, each with the reason (none left: the LISTEN connection
#: moved into the store and takes its keep-alive statement from it).
KNOWN_ELSEWHERE: set[Path] = set()


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (prose may say SELECT)."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def sql_literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    hits: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skip
            and SQL.search(node.value)
        ):
            hits.append((node.lineno, node.value.strip()[:60]))
    return hits


def test_sql_text_only_in_statements_modules() -> None:
    offenders = {
        str(path.relative_to(PACKAGE.parent)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in ALLOWED | KNOWN_ELSEWHERE and (hits := sql_literals(path))
    }
    assert offenders == {}, f"SQL text outside the statements modules: {offenders}"


def test_the_check_finds_sql_where_it_is() -> None:
    for engine, modules in ENGINE_STATEMENTS.items():
        assert len(modules) > 1, f"{engine} statements package not found: the check would be blind"
        assert any(sql_literals(path) for path in modules), f"{engine} statements hold no SQL?"
    for path in KNOWN_ELSEWHERE:
        assert sql_literals(path), f"{path} holds no SQL? the check would be blind"


def test_a_verb_module_is_not_allowed_sql() -> None:
    """The verb modules sit beside the statements package, not inside it."""
    for engine in ENGINE_STATEMENTS:
        verbs = {p for p in (PACKAGE / "store" / engine).glob("*.py") if p.name != "__init__.py"}
        assert {"runs.py", "lifecycle.py", "store.py"} <= {p.name for p in verbs}
        assert not verbs & ALLOWED, f"{engine} verb modules are allowed SQL"


def test_the_check_flags_sql_in_a_verb_module(tmp_path: Path) -> None:
    verb = tmp_path / "runs.py"
    verb.write_text('async def get(db):\n    return await db.fetch("SELECT * FROM runs")\n')
    assert sql_literals(verb) == [(2, "SELECT * FROM runs")]
