"""What a run keeps of its answer, per ``[privacy] level`` (docs/privacy.md).

``none`` keeps nothing, ``redacted`` keeps the answer with secrets and personal data
masked and its length capped, ``metadata`` and ``full`` keep it whole: a background
answer nobody watched arrive is the run's whole point, so the default keeps it.

Redaction runs on text that callers control, so it must never be slow: every pattern
below is linear in the length of its input. Python's ``re`` backtracks, and a pattern
like ``[a-z-]+@`` retried from each of n start positions costs n² on ``a-a-a-...``.
Each unbounded run therefore (1) may only start where a run of its own characters
starts (a negative lookbehind of the same class, so every other start fails in O(1)),
and (2) is possessive (``++``), so a failed match never re-scans the run with fewer
characters. Everything else is bounded. A value large enough to take noticeable time is
redacted in a worker thread (``keep_answer_async``), and nesting is cut at ``MAX_DEPTH``.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import re
from typing import Any

import anyio
import msgspec

MASK = "[redacted]"
TRUNCATED = "…[truncated]"
#: Containers nested deeper than this are replaced by ``TOO_DEEP``: the walk (and the JSON
#: encoding after it) stays far from the interpreter's recursion limit.
MAX_DEPTH = 64
TOO_DEEP = "[redacted: nested too deep]"
#: Above about this many characters an answer is redacted off the event loop.
THREAD_THRESHOLD_CHARS = 32_768

# -- the patterns ------------------------------------------------------------------------
# Character classes shared by a run and the lookbehind that pins its start.
_WORD = r"A-Za-z0-9_\-"
_OPAQUE = r"A-Za-z0-9_\-+/"

_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+\-])[A-Za-z0-9._%+\-]++"  # the local part, from its start
    r"@(?:[A-Za-z0-9\-]{1,63}+\.){1,8}[A-Za-z]{2,24}+(?![A-Za-z0-9\-])"
)
# ``Bearer <token>`` and ``Basic <base64 of user:password>``.
_AUTH_SCHEME = re.compile(r"(?i)\b(bearer|basic)([ \t]{1,8}+)([A-Za-z0-9\-._~+/]++=*+)")
# Provider-style keys (sk-..., ghp_..., xoxb-..., glpat-...) and AWS access key ids, read at
# the start of a token run (``_TOKEN_RUN``).
_PROVIDER_KEY = re.compile(
    rf"(?:sk|pk|rk|ghp|gho|ghs|ghu|ghr|github_pat|glpat|xox[abprs]|hf|npm)[-_][{_WORD}]{{16}}"
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Z])"
)
# header.payload.signature, each base64url; the header is JSON, so it starts with ``eyJ``.
_JWT = re.compile(rf"(?<![{_WORD}.])eyJ[{_WORD}]++\.[{_WORD}]++\.[{_WORD}]*+")
#: Names (lower case, ``-`` read as ``_``) whose values are credentials wherever they
#: appear; ``_SENSITIVE_SUFFIXES`` and ``_SENSITIVE_PARTS`` catch ``client_secret``,
#: ``x_api_key``, ``refresh_token``, ``db_password`` and the like.
_SENSITIVE_NAMES = frozenset(
    {"authorization", "auth", "pwd", "passphrase", "cookie", "set_cookie", "credentials"}
)
_SENSITIVE_SUFFIXES = (
    "token",
    "api_key",
    "apikey",
    "access_key",
    "private_key",
    "secret_key",
    "session_key",
    "signing_key",
    "credential",
)
_SENSITIVE_PARTS = ("password", "passwd", "secret")
#: Names that are credentials in a URL query (``?key=...``, ``&sig=...``) but too common
#: elsewhere to mask (``{"key": "task/echo"}``).
_SENSITIVE_QUERY_NAMES = frozenset({"key", "sig", "signature", "code"})


def _spellings(words: Any) -> list[str]:
    """Each word as written and with ``_`` read as ``-`` or left out."""
    out = {variant for w in words for variant in (w, w.replace("_", "-"), w.replace("_", ""))}
    return sorted(out, key=len, reverse=True)


def _ends_with_one_of(words: Any) -> str:
    """Lookbehinds for the endings: one per length (Python's need a fixed width), behind
    a one-character check of the last letter, so a name that cannot match costs one step."""
    spellings = _spellings(words)
    by_length: dict[int, list[str]] = {}
    for word in spellings:
        by_length.setdefault(len(word), []).append(re.escape(word))
    last_letters = "".join(sorted({word[-1] for word in spellings}))
    endings = "|".join(f"(?<={'|'.join(group)})" for group in by_length.values())
    return f"(?<=[{last_letters}])(?:{endings})"


# ``name = value``, ``"name": "value"``, ``?name=value&...`` where the name says the value
# is a credential. The name run is only taken further when a separator follows it, and is
# judged by its ending (or its start, for password/secret), so ordinary text costs a few
# steps per word. The name is part of the pattern, not judged in a callback: a match
# consumes its value, so a pattern that matched every name would swallow
# ``https://host/path?token=...`` at ``https:`` and never see the query.
_SEPARATOR_AHEAD = r"(?=[\"']?[ \t]{0,8}+[:=])"
_CREDENTIAL_NAME = (
    rf"(?<![\w\-])(?:(?={'|'.join(_spellings(_SENSITIVE_PARTS))})[\w\-]{{1,64}}+{_SEPARATOR_AHEAD}"
    rf"|[\w\-]{{1,64}}+{_SEPARATOR_AHEAD}"
    rf"{_ends_with_one_of((*_SENSITIVE_PARTS, *_SENSITIVE_SUFFIXES, *_SENSITIVE_NAMES))})"
    rf"|(?<=[?&])(?:{'|'.join(_spellings(_SENSITIVE_QUERY_NAMES))}){_SEPARATOR_AHEAD}"
)
_KEY_VALUE = re.compile(
    rf"(?i)({_CREDENTIAL_NAME})"
    r"([\"']?[ \t]{0,8}+[:=][ \t]{0,8}+)"  # the separator, with an optional closing quote
    r"(\"(?:[^\"\\\n]|\\.){1,1024}+\"|'(?:[^'\\\n]|\\.){1,1024}+'|[^\s\"'&,;<>(){}\[\]]++)"
)
# A long run of token characters: a provider key, or judged by ``_looks_opaque`` (hex,
# base64, base64url).
_TOKEN_RUN = re.compile(rf"(?<![{_OPAQUE}])[{_OPAQUE}]{{19,}}+=*+")
# Digits in groups separated by single spaces or dashes, at least 13 digits in all.
_DIGIT_RUN = re.compile(r"(?<![\d])\d(?:[ \-]?\d){12,}+")

#: Digit runs longer than this are not read as card numbers (a card is 13 to 19 digits).
_MAX_CARD_RUN_CHARS = 64


def is_sensitive_name(name: str) -> bool:
    """True when a key or parameter called ``name`` holds a credential."""
    lowered = name.lower().replace("-", "_")
    return (
        lowered in _SENSITIVE_NAMES
        or lowered.endswith(_SENSITIVE_SUFFIXES)
        or any(part in lowered for part in _SENSITIVE_PARTS)
    )


# -- judging a match -----------------------------------------------------------------------


def _luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def is_card_number(digits: str) -> bool:
    return 13 <= len(digits) <= 19 and digits.isdigit() and _luhn_ok(digits)


def _mask_cards(match: re.Match[str]) -> str:
    """Mask the longest Luhn-valid 13 to 19 digit stretch that starts and ends on a group
    boundary (``order 12 4111 1111 1111 1111`` masks the card and keeps ``12``)."""
    text = match.group(0)
    if len(text) > _MAX_CARD_RUN_CHARS:
        return text
    groups = [(m.start(), m.end()) for m in re.finditer(r"\d+", text)]
    for i, (start, _) in enumerate(groups):
        digits, card_end = "", None
        for group_start, group_end in groups[i:]:
            digits += text[group_start:group_end]
            if len(digits) > 19:
                break
            if is_card_number(digits):
                card_end = group_end
        if card_end is not None:
            return text[:start] + MASK + _mask_cards_in(text[card_end:])
    return text


def _mask_cards_in(text: str) -> str:
    return _DIGIT_RUN.sub(_mask_cards, text) if text else text


def _mask_auth_scheme(match: re.Match[str]) -> str:
    scheme, space, credential = match.groups()
    if scheme.lower() == "basic" and not _is_basic_credential(credential):
        return match.group(0)
    return f"{scheme}{space}{MASK}"


def _is_basic_credential(text: str) -> bool:
    """``Basic`` is also an English word: mask only base64 that decodes to ``user:pass``."""
    if len(text) < 4 or len(text) % 4:
        return False
    try:
        decoded = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return False
    return b":" in decoded


def _mask_key_value(match: re.Match[str]) -> str:
    name, separator, value = match.groups()
    bare = value.strip("\"'")
    if bare == MASK or bare.lower() in ("bearer", "basic"):
        return match.group(0)
    quote = value[0] if value[0] in "\"'" else ""
    return f"{name}{separator}{quote}{MASK}{quote}"


def _looks_opaque(run: str) -> bool:
    """A long token-character run that is a secret rather than a path, slug or UUID: one
    long alphanumeric stretch with a digit (hex keys, base64), or, without ``/``, mixed
    case with digits (base64url tokens)."""
    core = run.rstrip("=")
    if len(core) < 32:
        return False
    if not any(c.isdigit() for c in core) or not any(c.isalpha() for c in core):
        return False
    if max(len(piece) for piece in re.split(r"[-_/+]", core)) >= 20:
        return True
    if not (any(c.islower() for c in core) and any(c.isupper() for c in core)):
        return False
    # Mixed case with digits: a secret, unless '/' makes it a path of words
    # ("/api/v1/Users/Report2024"), whose characters change class far less often.
    return "/" not in core or _case_change_ratio(core) >= 0.3


def _case_change_ratio(text: str) -> float:
    """Among neighbouring letters and digits, the share that differ in kind (lower, upper,
    digit): about 0.65 for random base64, under 0.25 for words and numbers."""
    kinds = [0 if c.islower() else 1 if c.isupper() else 2 if c.isdigit() else -1 for c in text]
    pairs = [(a, b) for a, b in itertools.pairwise(kinds) if a >= 0 and b >= 0]
    return sum(a != b for a, b in pairs) / len(pairs) if pairs else 0.0


def _mask_token(match: re.Match[str]) -> str:
    run = match.group(0)
    return MASK if _PROVIDER_KEY.match(run) or _looks_opaque(run) else run


# -- redaction -----------------------------------------------------------------------------


def redact_text(text: str) -> str:
    """``text`` with credentials, e-mail addresses and card numbers replaced by ``MASK``.
    Linear in ``len(text)`` whatever it holds."""
    text = _AUTH_SCHEME.sub(_mask_auth_scheme, text)
    text = _JWT.sub(MASK, text)
    text = _KEY_VALUE.sub(_mask_key_value, text)
    if "@" in text:
        text = _EMAIL.sub(MASK, text)
    text = _TOKEN_RUN.sub(_mask_token, text)
    return _DIGIT_RUN.sub(_mask_cards, text)


def redact_value(value: Any, *, _depth: int = 0) -> Any:
    """Mask every string inside a JSON-shaped value (keys too: they can hold addresses),
    every value under a credential-named key, and card numbers given as numbers."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return MASK if is_card_number(str(abs(value))) else value
    if isinstance(value, dict | list | tuple) and _depth >= MAX_DEPTH:
        return TOO_DEEP
    if isinstance(value, dict):
        return {redact_text(str(k)): _redact_entry(str(k), v, _depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(v, _depth=_depth + 1) for v in value]
    return value


def _redact_entry(key: str, value: Any, depth: int) -> Any:
    credential = isinstance(value, str | int | float) and not isinstance(value, bool)
    if credential and value != "" and is_sensitive_name(key):
        return MASK
    return redact_value(value, _depth=depth)


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


async def keep_answer_async(level: str, answer: Any, max_chars: int = 4000) -> tuple[bool, Any]:
    """``keep_answer`` for the event loop: a large answer is redacted in a worker thread,
    so heartbeats, claims and the API carry on meanwhile."""
    if level == "redacted" and is_larger_than(answer, THREAD_THRESHOLD_CHARS):
        return await anyio.to_thread.run_sync(keep_answer, level, answer, max_chars)
    return keep_answer(level, answer, max_chars)


def is_larger_than(value: Any, budget: int) -> bool:
    """Whether ``value`` holds more than about ``budget`` characters; stops counting as
    soon as it does, so the check itself costs at most ``budget`` steps."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            budget -= len(item)
        elif isinstance(item, dict | list | tuple):
            budget -= len(item)
            if budget < 0:
                return True
            stack.extend(item.items() if isinstance(item, dict) else item)
        else:
            budget -= 1
        if budget < 0:
            return True
    return False


#: What a failed run keeps of its error at level ``none``: the handler's message may quote
#: the payload or an upstream body, so none of it is kept.
ERROR_NOT_KEPT = "the handler failed (its message is not kept at [privacy] level = none)"


def keep_error(level: str, text: str) -> str:
    """A handler's error message as the privacy level lets a run keep it: as is at
    ``metadata``/``full``, masked at ``redacted``, a generic line at ``none``. ``text`` is
    short (the executor caps it), so redacting it on the event loop is cheap."""
    if level == "none":
        return ERROR_NOT_KEPT
    if level == "redacted":
        return redact_text(text)
    return text
