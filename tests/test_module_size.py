"""No module in runq/ passes 500 lines: past that a module holds more than one concern and
a reader cannot find a verb, a statement or a default in it (split it by concern instead)."""

from __future__ import annotations

from pathlib import Path

import runq

PACKAGE = Path(runq.__file__).parent
MAX_LINES = 500


def line_counts(root: Path) -> dict[str, int]:
    return {
        str(path.relative_to(root.parent)): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(root.rglob("*.py"))
    }


def too_long(root: Path, limit: int = MAX_LINES) -> dict[str, int]:
    return {name: n for name, n in line_counts(root).items() if n > limit}


def test_every_module_is_under_the_limit() -> None:
    counts = line_counts(PACKAGE)
    assert len(counts) > 50, "runq's modules not found: the check would be blind"
    assert too_long(PACKAGE) == {}, f"modules over {MAX_LINES} lines: split them by concern"


def test_the_check_flags_a_long_module(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "short.py").write_text("x = 1\n" * MAX_LINES)
    (package / "sub" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert too_long(package) == {"pkg/sub/long.py": MAX_LINES + 1}
