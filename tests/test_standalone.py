"""The repository stands alone: nothing in it points at documents a user never has.

A clone of runq is all a user or contributor gets. A comment that cites a section of the
founding design notes, or a link into the folder that held them beside the checkout,
explains nothing to them; the reason belongs in the comment itself, and the contract in
``docs/design.md``. This test reads every file
git tracks and fails with the file and line of each such citation.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
THIS_FILE = Path(__file__).resolve().relative_to(REPO).as_posix()

#: Each pattern names a way the founding documents were cited.
CITATIONS: dict[str, re.Pattern[str]] = {
    "a relative link to the founding notes": re.compile(r"\.\./" + "shared" + r"\b"),
    "an absolute path to the founding notes": re.compile("/work" + r"/shared\b"),
    "a section of the design notes": re.compile(r"DESIGN\s?§"),
    "a bare section number": re.compile(r"§\s?\d"),
    "the design notes file": re.compile("DESIGN" + r"\.md"),
    "a seed": re.compile(r"\bseeds?\s+00\d", re.IGNORECASE),
    "what the seed says": re.compile(
        r"\bthe\s+seeds?\s+(?:says?|names?|gives?|decides?)\b", re.IGNORECASE
    ),
}


def tracked_files() -> list[str]:
    """Paths git tracks in this checkout (not .git itself, not ignored build output)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: nothing to list tracked files with")
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z"],
        check=True,
        capture_output=True,
    ).stdout.decode()
    return [path for path in listed.split("\0") if path]


def citations_in(text: str) -> list[tuple[int, str]]:
    """(line number, what was cited) for every line of ``text`` that cites something; a
    line is reported once, with the first pattern that matches it."""
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        what = next((what for what, pattern in CITATIONS.items() if pattern.search(line)), None)
        if what is not None:
            found.append((number, what))
    return found


def test_the_patterns_catch_each_way_of_citing() -> None:
    # Built from parts, so this file does not cite anything itself.
    shared = "../" + "shared/DESIGN" + ".md"
    samples = [
        f"see [the design]({shared})",
        "/work/" + "shared/seeds/",
        "the reaper rules (DESIGN " + "§6)",
        "DESIGN" + "§3 as data",
        "follows Seed " + "003",
        "§" + "6 and the rest",
        "The seed " + "says unknown fields are ignored",
    ]
    for sample in samples:
        assert citations_in(sample), f"not caught: {sample!r}"
    assert not citations_in("rng = random.Random(plan.seed + 1)  # see docs/design.md")


def test_no_tracked_file_cites_documents_outside_the_repository() -> None:
    hits: list[str] = []
    for path in tracked_files():
        if path == THIS_FILE:
            continue
        file = REPO / path
        if not file.is_file():
            continue  # deleted in the work tree, not yet committed
        text = file.read_bytes().decode("utf-8", errors="replace")
        hits.extend(f"{path}:{line}: {what}" for line, what in citations_in(text))
    assert not hits, "citations of documents outside the repository:\n" + "\n".join(hits)
