"""What a run keeps of its answer, per ``[privacy] level``.

``none`` keeps nothing, ``redacted`` keeps the answer with secrets and personal data
masked and its length capped, ``metadata`` and ``full`` keep it whole: a background
answer nobody watched arrive is the run's whole point, so the default keeps it.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

MASK = "[redacted]"
TRUNCATED = "…[truncated]"

_EMAIL = re.compile(r"[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}")
_BEARER = re.compile(r"(?i)\bbearer\s+[A-Za-z0-9\-._~+/]+=*")
# Provider-style keys (sk-..., ghp_..., xoxb-..., AKIA...) and long opaque tokens.
_API_KEY = re.compile(
    r"\b(?:sk|pk|rk|ghp|gho|ghs|glpat|xox[abpr])[-_][A-Za-z0-9\-_]{16,}\b"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\b(?=[A-Za-z0-9_\-]*[0-9])(?=[A-Za-z0-9_\-]*[A-Za-z])[A-Za-z0-9_\-]{32,}\b"
)
_CARD = re.compile(r"\b(?:\d[ \-]?){12,18}\d\b")


def _luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _mask_card(match: re.Match[str]) -> str:
    digits = re.sub(r"\D", "", match.group(0))
    return MASK if 13 <= len(digits) <= 19 and _luhn_ok(digits) else match.group(0)


def redact_text(text: str) -> str:
    text = _BEARER.sub(f"Bearer {MASK}", text)
    text = _EMAIL.sub(MASK, text)
    text = _API_KEY.sub(MASK, text)
    return _CARD.sub(_mask_card, text)


def redact_value(value: Any) -> Any:
    """Mask every string inside a JSON-shaped value (keys too: they can hold addresses)."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {redact_text(str(k)): redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(v) for v in value]
    return value


def cap(value: Any, max_chars: int) -> Any:
    """Keep a value whole when its JSON fits ``max_chars``; otherwise its JSON text, cut."""
    if isinstance(value, str):
        return value if len(value) <= max_chars else value[:max_chars] + TRUNCATED
    encoded = msgspec.json.encode(value).decode()
    if len(encoded) <= max_chars:
        return value
    return encoded[:max_chars] + TRUNCATED


def keep_answer(level: str, answer: Any, max_chars: int = 4000) -> tuple[bool, Any]:
    """(whether to store an answer, the answer to store) for a privacy level."""
    if level == "none":
        return False, None
    if level == "redacted":
        return True, cap(redact_value(answer), max_chars)
    return True, answer
