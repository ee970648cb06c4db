"""Every Python block of README.md and docs/*.md is a complete program that runs.

pytest-examples finds the ```python fences and runs each one as ``__main__`` from a file
of its own, so a block's ``if __name__ == "__main__":`` program really executes. A block
that is only an excerpt says so in its info string (```python fragment) and is skipped
with that reason. A block runs in an empty scratch directory holding the files its page
saves with ``<!-- test: ... file=NAME -->`` (the configuration it names), and that
directory is on the import path, as it is for ``python NAME.py``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_examples import CodeExample, EvalExample, find_examples

from docs.markdown_blocks import ROOT, marked_blocks

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks() -> list[CodeExample]:
    return list(find_examples(*PAGES))


@pytest.fixture
def scratch_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty working directory on the import path; modules the block imported from
    it are forgotten afterwards, so the next block imports its own."""
    directory = tmp_path / "cwd"
    directory.mkdir()
    monkeypatch.chdir(directory)
    monkeypatch.syspath_prepend(str(directory))
    for name in [k for k in os.environ if k.startswith("RUNQ_")]:
        monkeypatch.delenv(name)
    before = set(sys.modules)
    yield directory
    for name in set(sys.modules) - before:
        module = sys.modules.get(name)
        if str(getattr(module, "__file__", "") or "").startswith(str(directory)):
            del sys.modules[name]


def test_the_docs_have_python_blocks() -> None:
    assert any(example.path.name == "README.md" for example in python_blocks())


@pytest.mark.parametrize("example", python_blocks(), ids=str)
def test_python_block_runs(
    example: CodeExample, eval_example: EvalExample, scratch_directory: Path
) -> None:
    if "fragment" in example.prefix_tags():
        pytest.skip("marked as a fragment (```python fragment)")
    for block in marked_blocks(example.path):
        if block.file is not None:
            (scratch_directory / block.file).write_text(block.text, encoding="utf-8")
    eval_example.run(example)
