"""Privacy levels: what a run keeps of its answer."""

from __future__ import annotations

import pytest

from runq.privacy import MASK, TRUNCATED, keep_answer, redact_text, redact_value


def test_none_keeps_nothing() -> None:
    assert keep_answer("none", {"text": "hello"}) == (False, None)


@pytest.mark.parametrize("level", ["metadata", "full"])
def test_metadata_and_full_keep_the_whole_answer(level: str) -> None:
    answer = {"text": "mail me at a@b.example", "n": [1, 2]}
    assert keep_answer(level, answer) == (True, answer)


@pytest.mark.parametrize(
    ("secret", "kept_context"),
    [
        ("alice@example.com", "write to"),
        ("Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl", "auth:"),
        ("sk-proj-abcdefghijklmnopqrstuvwx1234", "key="),
        ("4111 1111 1111 1111", "card"),
        ("AKIAABCDEFGHIJKLMNOP", "aws"),
    ],
)
def test_redacted_masks_secrets_and_keeps_the_rest(secret: str, kept_context: str) -> None:
    text = f"{kept_context} {secret} end"
    redacted = redact_text(text)
    assert secret not in redacted
    assert MASK in redacted
    assert redacted.startswith(kept_context)
    assert redacted.endswith("end")


def test_a_number_that_fails_luhn_is_not_a_card() -> None:
    assert redact_text("order 1234 5678 9012 3456") == "order 1234 5678 9012 3456"


def test_redaction_walks_nested_values_and_keys() -> None:
    value = {"bob@example.org": ["x", {"y": "carol@example.net"}], "n": 3}
    out = redact_value(value)
    assert out == {MASK: ["x", {"y": MASK}], "n": 3}


def test_redacted_answer_is_capped() -> None:
    keep, answer = keep_answer("redacted", "a" * 50_000, max_chars=100)
    assert keep
    assert answer == "a" * 100 + TRUNCATED
    keep, structured = keep_answer("redacted", {"k": "v" * 500}, max_chars=50)
    assert isinstance(structured, str)
    assert structured.endswith(TRUNCATED)
    assert len(structured) == 50 + len(TRUNCATED)
