"""``docs/design.md`` tells the truth about the state machine and the routing rule.

The design page is the contract users read; the code is what runs. These tests read the
page's transition table and routing examples and check them against ``runq.model`` and
``runq.transports``, so a change to either that forgets the other fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runq.model import TRANSITIONS, Status
from runq.transports.routing import resolve_route

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"

#: A row of the transition table: | `verb` | from | to | fenced | effect |
_ROW = re.compile(
    r"^\|\s*`(?P<verb>\w+)`\s*"
    r"\|(?P<sources>[^|]+)\|(?P<targets>[^|]+)\|(?P<fenced>[^|]+)\|"
)


def _statuses(cell: str) -> frozenset[Status]:
    """``queued, paused`` or ``queued or failed`` → the statuses named."""
    names = [part.strip() for part in re.split(r",|\bor\b", cell) if part.strip()]
    return frozenset(Status(name) for name in names)


def documented_transitions() -> dict[str, tuple[frozenset[Status], frozenset[Status], bool]]:
    text = DESIGN.read_text(encoding="utf-8")
    section = text[text.index("## 3. States and transitions") : text.index("## 4.")]
    rows: dict[str, tuple[frozenset[Status], frozenset[Status], bool]] = {}
    for line in section.splitlines():
        match = _ROW.match(line)
        if match is None or match["verb"] not in TRANSITIONS:
            continue
        fenced = match["fenced"].strip()
        assert fenced in ("yes", "no"), f"{match['verb']}: fenced is {fenced!r}"
        rows[match["verb"]] = (
            _statuses(match["sources"]),
            _statuses(match["targets"]),
            fenced == "yes",
        )
    return rows


def test_every_verb_of_the_model_is_documented_and_no_other() -> None:
    documented = documented_transitions()
    assert set(documented) == set(TRANSITIONS)


@pytest.mark.parametrize("verb", sorted(TRANSITIONS))
def test_the_documented_transition_matches_the_model(verb: str) -> None:
    sources, targets, fenced = documented_transitions()[verb]
    transition = TRANSITIONS[verb]
    assert sources == transition.sources, f"{verb}: the statuses it may start from"
    # Where the model also records targets and fencing, the page must agree with them.
    if hasattr(transition, "targets"):
        assert targets == transition.targets, f"{verb}: the statuses it may end in"
    if hasattr(transition, "fenced"):
        assert fenced == transition.fenced, f"{verb}: whether its write is fenced"


def test_the_documented_routing_examples_hold() -> None:
    routing = {
        "task/report": "postgres",
        "task/rep*": "local",
        "task/*": "sync",
        "*": "local",
    }
    assert resolve_route(routing, "task", "report") == "postgres"  # exact name first
    assert resolve_route(routing, "task", "reply") == "local"  # the longer glob next
    assert resolve_route(routing, "task", "render") == "sync"  # then type/*
    assert resolve_route(routing, "agent", "x") == "local"  # then "*"
    assert resolve_route({}, "agent", "x") == "sync"  # an unrouted component uses sync
