"""The three auth modes as units: open, key (constant-time, near misses) and JWT (PyJWT)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jwt
import pytest
from api_support import make_run
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from runq.api.auth import (
    Identity,
    JwtAuth,
    KeyAuth,
    OpenAuth,
    Unauthenticated,
    build_authenticator,
    scopes_from_claim,
)
from runq.config import HttpConfig, JwtConfig
from runq.errors import ConfigError
from runq.model import Actor

SECRET = "a-test-secret-that-is-long-enough-for-every-hmac-algorithm-0123456789"
KEY = "k3y-0123456789abcdef-0123456789abcdef"


def hs_token(claims: dict[str, Any], secret: str = SECRET, alg: str = "HS256") -> str:
    base = {"sub": "alice", "exp": int(time.time()) + 300}
    return jwt.encode({**base, **claims}, secret, algorithm=alg)


def jwt_auth(**overrides: Any) -> JwtAuth:
    return JwtAuth(JwtConfig(**overrides), SECRET)


def bearer(token: str) -> str:
    return f"Bearer {token}"


# -- open ------------------------------------------------------------------------------------


def test_open_is_an_anonymous_admin() -> None:
    identity = OpenAuth().authenticate(None)
    assert identity.is_admin
    assert identity.user_id is None
    assert identity.mode == "open"


def test_open_refused_on_a_public_address_unless_allowed() -> None:
    with pytest.raises(ConfigError, match=r"http\.auth"):
        build_authenticator(HttpConfig(listen="0.0.0.0:7777", auth="open"))
    allowed = build_authenticator(
        HttpConfig(listen="0.0.0.0:7777", auth="open", allow_open_on_public=True)
    )
    assert allowed.mode == "open"
    assert build_authenticator(HttpConfig(listen="[::1]:7777", auth="open")).mode == "open"


# -- key -------------------------------------------------------------------------------------


def test_key_accepts_the_exact_key_and_makes_an_admin_service_account() -> None:
    identity = KeyAuth(KEY).authenticate(bearer(KEY))
    assert identity.is_admin
    assert identity.service_account
    assert identity.mode == "key"
    assert KeyAuth(KEY).authenticate(f"bearer   {KEY}  ").is_admin  # scheme case, spaces


@pytest.mark.parametrize(
    "presented",
    [
        KEY[:-1] + ("0" if KEY[-1] != "0" else "1"),  # last character differs
        KEY[:-1],  # one character short
        KEY + "x",  # one character long
        KEY.upper(),
        "",
    ],
)
def test_key_refuses_near_misses(presented: str) -> None:
    with pytest.raises(Unauthenticated):
        KeyAuth(KEY).authenticate(bearer(presented))


@pytest.mark.parametrize("header", [None, "", KEY, f"Basic {KEY}", "Bearer", "Bearer   "])
def test_key_refuses_missing_or_malformed_headers(header: str | None) -> None:
    with pytest.raises(Unauthenticated):
        KeyAuth(KEY).authenticate(header)


def test_key_is_read_from_env_or_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNQ_TEST_API_KEY", KEY)
    from_env = build_authenticator(HttpConfig(auth="key", key="env:RUNQ_TEST_API_KEY"))
    assert from_env.authenticate(bearer(KEY)).is_admin
    key_file = tmp_path / "api.key"
    key_file.write_text(KEY + "\n")
    from_file = build_authenticator(HttpConfig(auth="key", key=f"file:{key_file}"))
    assert from_file.authenticate(bearer(KEY)).is_admin


def test_a_key_that_cannot_be_read_stops_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNQ_TEST_MISSING", raising=False)
    with pytest.raises(ConfigError, match=r"http\.key"):
        build_authenticator(HttpConfig(auth="key", key="env:RUNQ_TEST_MISSING"))


# -- jwt -------------------------------------------------------------------------------------


def test_jwt_sub_becomes_the_user_and_scopes_come_from_the_claim() -> None:
    identity = jwt_auth().authenticate(bearer(hs_token({"scope": "read runq:approve"})))
    assert identity.user_id == "alice"
    assert identity.scopes == ("read", "runq:approve")
    assert identity.is_approver
    assert not identity.is_admin
    assert identity.actor == Actor(user_id="alice", service_account=False, scopes=identity.scopes)


def test_jwt_admin_scope_from_a_list_claim_and_service_account_flag() -> None:
    auth = jwt_auth(scopes_claim="scp")
    token = hs_token({"scp": ["runq:admin", 3], "service_account": True})
    identity = auth.authenticate(bearer(token))
    assert identity.is_admin
    assert identity.is_approver
    assert identity.service_account


def test_jwt_without_scopes_is_a_plain_user() -> None:
    identity = jwt_auth().authenticate(bearer(hs_token({})))
    assert identity.scopes == ()
    assert not identity.is_admin
    assert not identity.is_approver


AUD, ISS = "runq-api", "https://issuer.example"
OTHER_SECRET = "another-secret-that-is-long-enough-too!!"


def strict_token(drop: str = "", secret: str = SECRET, alg: str = "HS256", **claims: Any) -> str:
    """A token valid for ``strict_auth`` except for what the arguments change."""
    base: dict[str, Any] = {"sub": "alice", "exp": int(time.time()) + 300, "aud": AUD, "iss": ISS}
    base.update(claims)
    base.pop(drop, None)
    return jwt.encode(base, secret, algorithm=alg)


# Tokens are built when the test runs, not when it is collected: a token built at
# collection would expire before a long suite reached it.
@pytest.mark.parametrize(
    ("make_token", "reason"),
    [
        (lambda: strict_token(exp=int(time.time()) - 120), "expired"),
        (lambda: strict_token(secret=OTHER_SECRET), "signature"),
        (lambda: strict_token(aud="someone-else"), "audience"),
        (lambda: strict_token(iss="https://evil.example"), "issuer"),
        (lambda: strict_token(nbf=int(time.time()) + 600), "not valid yet"),
        (lambda: strict_token(drop="exp"), "'exp'"),
        (lambda: strict_token(drop="sub"), "'sub'"),
        (lambda: strict_token(alg="HS512"), "not valid"),  # an algorithm that is not configured
        (lambda: strict_token(sub=""), "sub"),
        (lambda: "not.a.jwt", "not valid"),
    ],
    ids=[
        "expired",
        "other-secret",
        "audience",
        "issuer",
        "not-yet",
        "no-exp",
        "no-sub",
        "unconfigured-alg",
        "empty-sub",
        "garbage",
    ],
)
def test_jwt_refusals(make_token: Callable[[], str], reason: str) -> None:
    auth = jwt_auth(audience=AUD, issuer=ISS, leeway_seconds=0)
    assert auth.authenticate(bearer(strict_token())).user_id == "alice"
    with pytest.raises(Unauthenticated, match=reason):
        auth.authenticate(bearer(make_token()))


def test_jwt_leeway_accepts_a_just_expired_token() -> None:
    token = hs_token({"exp": int(time.time()) - 10})
    assert jwt_auth(leeway_seconds=30).authenticate(bearer(token)).user_id == "alice"
    with pytest.raises(Unauthenticated, match="expired"):
        jwt_auth(leeway_seconds=0).authenticate(bearer(token))


def test_jwt_audience_not_configured_accepts_any_audience() -> None:
    assert jwt_auth().authenticate(bearer(hs_token({"aud": "whatever"}))).user_id == "alice"


def _pem_public(private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> bytes:
    return private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


@pytest.mark.parametrize("alg", ["RS256", "ES256"])
def test_jwt_with_a_public_key_file(tmp_path: Path, alg: str) -> None:
    private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    if alg == "RS256":
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        other: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey = rsa.generate_private_key(
            public_exponent=65537, key_size=2048
        )
    else:
        private, other = (
            ec.generate_private_key(ec.SECP256R1()),
            ec.generate_private_key(ec.SECP256R1()),
        )
    pem = tmp_path / "jwt.pub"
    pem.write_bytes(_pem_public(private))
    config = HttpConfig(
        auth="jwt", jwt=JwtConfig(algorithms=(alg,), public_key=f"file:{pem}", audience="runq")
    )
    auth = build_authenticator(config)
    claims = {"sub": "bob", "exp": int(time.time()) + 60, "aud": "runq", "scope": "runq:admin"}
    assert auth.authenticate(bearer(jwt.encode(claims, private, algorithm=alg))).is_admin
    with pytest.raises(Unauthenticated, match="signature"):
        auth.authenticate(bearer(jwt.encode(claims, other, algorithm=alg)))
    with pytest.raises(Unauthenticated, match="audience"):
        auth.authenticate(bearer(jwt.encode({**claims, "aud": "x"}, private, algorithm=alg)))


def test_jwt_public_key_that_is_not_pem_stops_the_start(tmp_path: Path) -> None:
    pem = tmp_path / "jwt.pub"
    pem.write_text("not a key")
    config = HttpConfig(auth="jwt", jwt=JwtConfig(algorithms=("RS256",), public_key=f"file:{pem}"))
    with pytest.raises(ConfigError, match=r"http\.jwt\.public_key"):
        build_authenticator(config)


def test_jwt_hs_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNQ_TEST_JWT", SECRET)
    auth = build_authenticator(HttpConfig(auth="jwt", jwt=JwtConfig(secret="env:RUNQ_TEST_JWT")))
    assert auth.authenticate(bearer(hs_token({}))).user_id == "alice"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("a b  c", ("a", "b", "c")),
        (["a", "", 1, "b"], ("a", "b")),
        (None, ()),
        (42, ()),
    ],
)
def test_scopes_from_claim(value: object, expected: tuple[str, ...]) -> None:
    assert scopes_from_claim(value) == expected


def test_identity_rights() -> None:
    mine = make_run(user_id="alice")
    theirs = make_run(user_id="bob")
    nobody = make_run(user_id=None)
    alice = Identity("alice", False, (), is_admin=False, is_approver=False, mode="jwt")
    approver = Identity("carol", False, (), is_admin=False, is_approver=True, mode="jwt")
    assert alice.can_see(mine)
    assert alice.can_read_content(mine)
    assert alice.can_cancel(mine)
    assert not alice.can_see(theirs)
    assert not alice.can_see(nobody)
    assert approver.can_see(theirs)
    assert approver.can_continue(theirs)
    assert not approver.can_read_content(theirs)
    assert not approver.can_cancel(theirs)
    assert approver.can_see(nobody)
    assert not approver.can_read_content(nobody)


# -- identity cannot be borrowed -----------------------------------------------------------


@pytest.mark.parametrize(
    "subject",
    [
        "alice\x00",
        "ali\nce",
        "\x1b]52;c;aGk=\x07",  # an OSC 52 clipboard write
        "cli\u202e",  # right-to-left override
        " cli",
        "x" * 257,
    ],
)
def test_identity_cannot_be_borrowed_sub_is_printable_and_bounded(subject: str) -> None:
    with pytest.raises(Unauthenticated, match="sub"):
        jwt_auth().authenticate(bearer(hs_token({"sub": subject})))


def test_identity_sub_may_be_any_printable_text() -> None:
    for subject in ("josé", "x" * 256, "user@example.com", "a b"):
        assert jwt_auth().authenticate(bearer(hs_token({"sub": subject}))).user_id == subject


@pytest.mark.parametrize(
    ("algorithms", "length"), [(("HS256",), 31), (("HS384",), 47), (("HS256", "HS512"), 63)]
)
def test_identity_cannot_be_borrowed_short_hmac_secret_is_refused(
    algorithms: tuple[str, ...], length: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNQ_TEST_SHORT_SECRET", "s" * length)
    config = HttpConfig(
        auth="jwt", jwt=JwtConfig(secret="env:RUNQ_TEST_SHORT_SECRET", algorithms=algorithms)
    )
    with pytest.raises(ConfigError, match=r"at least") as excinfo:
        build_authenticator(config)
    assert excinfo.value.key == "http.jwt.secret"
    monkeypatch.setenv("RUNQ_TEST_SHORT_SECRET", "s" * (length + 1))
    assert build_authenticator(config).mode == "jwt"
