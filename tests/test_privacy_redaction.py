"""``[privacy] level = "redacted"`` on hostile and secret-bearing input.

The findings: the patterns backtracked (16 KB of ``a-`` took seconds, 1 MiB hours) on the
event loop; nesting 500 deep hit the recursion limit and stranded the run; several common
secrets went through. How fast redaction is per byte is measured by
``bench/redaction_bench.py``; here a generous deadline only tells "linear" from
"quadratic", and hypothesis checks what comes out.
"""

from __future__ import annotations

import base64
import random
import string
import subprocess
import sys
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runq.privacy import MASK, keep_answer, redact_text, redact_value

# -- the finding: quadratic patterns ----------------------------------------------------

#: Inputs that made the old patterns quadratic, 512 KiB each: seconds when linear,
#: hours when not. A subprocess with a deadline tells the two apart without timing.
ADVERSARIAL = {
    "a-": "a-",
    "a1": "a1",
    "word-digit": "ab1-",
    "dash-digits": "1-2",
    "near-jwt": "eyJa.",
}


@pytest.mark.parametrize("unit", sorted(ADVERSARIAL.values()))
def test_quadratic_redaction_finding_adversarial_text_redacts_in_linear_time(unit: str) -> None:
    program = (
        "from runq.privacy import redact_text\n"
        f"text = {unit!r} * ({512 * 1024} // {len(unit)})\n"
        "redact_text(text)\n"
    )
    completed = subprocess.run([sys.executable, "-c", program], timeout=60, check=False)
    assert completed.returncode == 0


def _nested(depth: int) -> Any:
    value: Any = "alice@example.com"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def test_deep_nesting_finding_depth_500_is_cut_instead_of_failing_the_run() -> None:
    from runq.privacy import TOO_DEEP

    keep, stored = keep_answer("redacted", _nested(500), max_chars=100_000)
    assert keep
    assert TOO_DEEP in str(stored)
    assert "alice@example.com" not in str(stored)


def test_shallow_nesting_is_walked_whole() -> None:
    assert redact_value(_nested(40)) == _nested_masked(40)


def _nested_masked(depth: int) -> Any:
    value: Any = MASK
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


async def _loop_turns_while(work: Any) -> int:
    """How many times the event loop ran another task while ``work()`` was awaited."""
    turns = 0
    done = anyio.Event()

    async def tick() -> None:
        nonlocal turns
        while not done.is_set():
            turns += 1
            await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(tick)
        await anyio.lowlevel.checkpoint()
        start = turns
        await work()
        done.set()
    return turns - start


@pytest.mark.anyio
async def test_event_loop_finding_a_large_answer_is_redacted_off_the_loop() -> None:
    from runq.privacy import keep_answer_async

    answer = {"text": "a-" * 2_000_000, "to": "alice@example.com"}

    async def work() -> None:
        keep, stored = await keep_answer_async("redacted", answer, max_chars=1000)
        assert keep
        assert "alice@example.com" not in str(stored)

    assert await _loop_turns_while(work) > 0


@pytest.mark.anyio
async def test_a_small_answer_is_redacted_inline() -> None:
    from runq.privacy import keep_answer_async

    assert await keep_answer_async("redacted", {"to": "a@b.example"}) == (True, {"to": MASK})
    assert await keep_answer_async("full", {"to": "a@b.example"}) == (
        True,
        {"to": "a@b.example"},
    )


# -- the finding: secrets that went through ------------------------------------------------

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJlc2lnbmF0dXJl"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
BASE64_SECRET = "q3T9+vWn0Zk2L8s/YpR4xH7cJb6Ue1AaMdQfGtIo=="


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"aws {AWS_SECRET} end", f"aws {MASK} end"),
        (f"key {BASE64_SECRET} end", f"key {MASK} end"),
        ("auth: Basic dXNlcjpodW50ZXIy end", f"auth: Basic {MASK} end"),
        (f"jwt {JWT} end", f"jwt {MASK} end"),
        ("password=hunter2 end", f"password={MASK} end"),
        ('{"client_secret": "s3 cr3t"} end', f'{{"client_secret": "{MASK}"}} end'),
        ("X-Api-Key: abc123 end", f"X-Api-Key: {MASK} end"),
        ("https://h.example/cb?code=1&access_token=abc&x=2", None),
        (
            "https://h.example/v1?key=AIzaSyA1&q=cats end",
            f"https://h.example/v1?key={MASK}&q=cats end",
        ),
        ("card 12 4111 1111 1111 1111 end", f"card 12 {MASK} end"),
        (f"opt=sk-proj-abcdefghijklmnopqrstuvwx1234&b64={BASE64_SECRET}", f"opt={MASK}&b64={MASK}"),
    ],
)
def test_missed_secrets_finding_text_forms_are_masked(text: str, expected: str | None) -> None:
    redacted = redact_text(text)
    if expected is None:
        expected = f"https://h.example/cb?code={MASK}&access_token={MASK}&x=2"
    assert redacted == expected


def test_missed_secrets_finding_values_under_credential_keys_are_masked() -> None:
    answer = {
        "Password": "hunter2",
        "api_key": "k",
        "Authorization": "Token t",
        "x-api-key": 12345,
        "client_secret": "c",
        "refresh_token": "r",
        "usage": {"total_tokens": 12, "prompt_tokens": 3},
        "key": "task/echo",
    }
    assert redact_value(answer) == {
        "Password": MASK,
        "api_key": MASK,
        "Authorization": MASK,
        "x-api-key": MASK,
        "client_secret": MASK,
        "refresh_token": MASK,
        "usage": {"total_tokens": 12, "prompt_tokens": 3},
        "key": "task/echo",
    }


def test_missed_secrets_finding_card_numbers_given_as_numbers_are_masked() -> None:
    answer = {"card": 4111111111111111, "order": 4111111111111112, "n": 7, "ok": True}
    assert redact_value(answer) == {"card": MASK, "order": 4111111111111112, "n": 7, "ok": True}


@pytest.mark.parametrize(
    "text",
    [
        "see /api/v1/Users/Report2024/Final/Details/Settings for the report",
        "run 123e4567-e89b-12d3-a456-426614174000 finished",
        "deploy my-service-name-2024-production-cluster-01 now",
        "a basic idea, basically",
        "the key: value pairs and the token count",
    ],
)
def test_ordinary_text_is_kept(text: str) -> None:
    assert redact_text(text) == text


# -- properties ------------------------------------------------------------------------------

#: Filler that cannot form a secret: short lower-case words (no digits, no ``s``/``t``/``r``
#: so no credential names), and punctuation that ends a token.
FILLER = st.text(alphabet="abcdefghijklmno .,!?", max_size=40).map(lambda s: s.strip() or "x")


def _random_chars(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _luhn_complete(rng: random.Random, length: int) -> str:
    digits = [rng.randrange(10) for _ in range(length - 1)]
    for check in range(10):
        candidate = "".join(map(str, [*digits, check]))
        total = 0
        for i, ch in enumerate(reversed(candidate)):
            d = int(ch) * (2 if i % 2 else 1)
            total += d - 9 if d > 9 else d
        if total % 10 == 0:
            return candidate
    raise AssertionError("unreachable")


def _secret(kind: str, rng: random.Random) -> tuple[str, str]:
    """A secret of ``kind`` and what it must become."""
    b64 = string.ascii_letters + string.digits + "+/"
    b64url = string.ascii_letters + string.digits + "-_"
    if kind == "jwt":
        parts = [_random_chars(rng, b64url, rng.randint(4, 60)) for _ in range(3)]
        return f"eyJ{parts[0]}.eyJ{parts[1]}.{parts[2]}", MASK
    if kind == "aws_secret":
        key = _random_chars(rng, b64, 38)
        return key[:19] + rng.choice(string.digits) + rng.choice("/+") + key[19:], MASK
    if kind == "base64":
        raw = bytes(rng.randrange(256) for _ in range(rng.randint(24, 64)))
        encoded = base64.b64encode(raw).decode()
        return encoded + "9" if not any(c.isdigit() for c in encoded) else encoded, MASK
    if kind == "provider":
        prefix = rng.choice(["sk-", "sk-proj-", "ghp_", "xoxb-", "glpat-"])
        return prefix + _random_chars(rng, b64url, rng.randint(20, 50)), MASK
    if kind == "card":
        digits = _luhn_complete(rng, rng.choice([13, 15, 16, 19]))
        sep = rng.choice(["", " ", "-"])
        return sep.join(digits[i : i + 4] for i in range(0, len(digits), 4)), MASK
    if kind == "email":
        local = _random_chars(rng, string.ascii_lowercase + "._+-", rng.randint(1, 20))
        return f"x{local}@mail{rng.randint(0, 99)}.example.com", MASK
    if kind == "bearer":
        return f"Bearer {_random_chars(rng, b64url, rng.randint(8, 60))}", f"Bearer {MASK}"
    if kind == "basic":
        user = _random_chars(rng, string.ascii_letters, 6)
        password = _random_chars(rng, string.printable[:94], rng.randint(1, 20))
        credential = base64.b64encode(f"{user}:{password}".encode()).decode()
        return f"Basic {credential}", f"Basic {MASK}"
    name = rng.choice(
        ["password", "DB_PASSWORD", "client_secret", "access_token", "X-Api-Key", "apiKey"]
    )
    sep = rng.choice(["=", ": ", " = ", "="])
    value = _random_chars(rng, string.ascii_letters + string.digits, rng.randint(1, 30))
    return f"{name}{sep}{value}", f"{name}{sep}{MASK}"


SECRET_KINDS = [
    "jwt", "aws_secret", "base64", "provider", "card", "email", "bearer", "basic", "key_value",
]  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prefix=FILLER,
    suffix=FILLER,
    kind=st.sampled_from(SECRET_KINDS),
    rng=st.integers(min_value=0, max_value=2**32).map(random.Random),
)
def test_a_secret_between_ordinary_words_is_masked_and_the_words_kept(
    prefix: str, suffix: str, kind: str, rng: random.Random
) -> None:
    secret, masked = _secret(kind, rng)
    assert redact_text(f"{prefix} {secret} {suffix}") == f"{prefix} {masked} {suffix}"


#: Characters the patterns care about, to build strings that come close to every one.
TRICKY = "a-=@.:/+_1 4\"'?&eyJBasicBearer\n\t[]{}"


@settings(max_examples=300, deadline=None)
@given(noise=st.text(alphabet=TRICKY, max_size=3000) | st.text(max_size=500))
def test_any_text_redacts_to_a_fixed_point(noise: str) -> None:
    once = redact_text(noise)
    assert isinstance(once, str)
    assert redact_text(once) == once


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    before=st.text(alphabet=TRICKY, max_size=400),
    after=st.text(alphabet=TRICKY, max_size=400),
    kind=st.sampled_from(SECRET_KINDS),
    rng=st.integers(min_value=0, max_value=2**32).map(random.Random),
)
def test_a_secret_inside_adversarial_noise_does_not_survive(
    before: str, after: str, kind: str, rng: random.Random
) -> None:
    secret, _ = _secret(kind, rng)
    assert secret not in redact_text(f"{before} {secret} {after}")


@settings(max_examples=100, deadline=None)
@given(
    unit=st.sampled_from(["a-", "a=", "a1", "x@", "eyJa.", "QUJD+/", "1 ", "1-2", "?token=&"]),
    repeat=st.integers(min_value=1, max_value=20_000),
)
def test_repeated_adversarial_units_redact(unit: str, repeat: int) -> None:
    # Linear time is measured by bench/redaction_bench.py; here: it finishes, stays text.
    assert isinstance(redact_text(unit * repeat), str)
