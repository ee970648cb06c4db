"""The code blocks of a Markdown file that a test runs, and a fresh copy of the checkout.

A block is marked for a test by an HTML comment right above its fence, invisible on the
rendered page::

    <!-- test: walkthrough file=agents.py -->
    ```python

The first word names the scenario; ``file=NAME`` writes the block to NAME instead of
running it; other words are flags the scenario's test understands (``install``,
``daemon``, ``stop=daemon``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

_MARK = re.compile(r"<!--\s*test:\s*(?P<words>.*?)\s*-->")


@dataclass(frozen=True)
class Block:
    """One marked fence: its scenario, options, language, text and first line."""

    scenario: str
    flags: frozenset[str]
    options: dict[str, str] = field(hash=False)
    language: str
    text: str
    line: int

    @property
    def file(self) -> str | None:
        return self.options.get("file")

    def where(self) -> str:
        return f"README.md line {self.line} ({self.language})"


def marked_blocks(path: Path, scenario: str | None = None) -> list[Block]:
    """The marked fences of ``path`` in document order (only ``scenario``'s if given)."""
    tokens = MarkdownIt("commonmark").parse(path.read_text(encoding="utf-8"))
    blocks: list[Block] = []
    mark: list[str] | None = None
    for token in tokens:
        if token.type == "html_block":
            match = _MARK.fullmatch(token.content.strip())
            mark = match.group("words").split() if match else None
            continue
        if token.type == "fence" and mark:
            options = dict(word.split("=", 1) for word in mark[1:] if "=" in word)
            flags = frozenset(word for word in mark[1:] if "=" not in word)
            line = (token.map[0] + 1) if token.map else 0
            block = Block(mark[0], flags, options, token.info.split()[0], token.content, line)
            if scenario is None or block.scenario == scenario:
                blocks.append(block)
        if token.type in ("fence", "paragraph_open", "heading_open"):
            mark = None  # a mark applies to the fence right below it only
    return blocks


def copy_checkout(target: Path) -> Path:
    """The tracked files of this checkout, as they are on disk, copied into ``target``:
    what a fresh clone holds, including changes not yet committed."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if not source.is_file():
            continue  # deleted in the working tree
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)
    return target
