"""Who is asking: ``[http] auth`` = open | key | jwt, turned into an ``Identity``.

This module knows nothing about Litestar: it takes the ``Authorization`` header value
and returns an ``Identity`` or raises ``Unauthenticated``. The app decides what an
identity may do (``can_read``, ``can_continue`` ...), always from these flags.

- ``open``: no credentials; every caller is an anonymous admin. Config validation already
  refuses it on a non-loopback address unless ``allow_open_on_public = true``; the
  authenticator checks again so an app built by hand cannot skip that rule.
- ``key``: ``Authorization: Bearer <key>``; the key is read once from ``env:NAME`` or
  ``file:/path`` and compared in constant time. A key holder is an admin service account.
- ``jwt``: a PyJWT-verified bearer token. ``sub`` becomes the user id, scopes come from the
  configured claim, ``exp`` and ``sub`` are required (a token that never expires is a
  standing credential nobody can revoke). ``sub`` must be printable text of at most
  ``MAX_SUBJECT_CHARS`` characters: it is stored, logged, shown in terminals and sent to
  sidecars as a header. An HMAC secret shorter than its hash (32 bytes for HS256) is
  refused at start: a short secret can be brute-forced from any one token.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from dataclasses import dataclass
from typing import Any, Protocol

import jwt
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from runq.config import HttpConfig, JwtConfig, is_loopback, split_listen
from runq.errors import ConfigError, RunqError
from runq.model import Actor, Run
from runq.seal import read_secret

log = logging.getLogger("runq.api.auth")

#: A key shorter than this is accepted (operators may have reasons) but logged at start.
SHORT_KEY_CHARS = 16
#: Longest JWT ``sub`` accepted as a user id.
MAX_SUBJECT_CHARS = 256
#: RFC 7518 3.2: an HMAC key at least as long as the hash output.
HMAC_MIN_SECRET_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
#: Claim that marks a JWT subject as a service account (a machine client, not a person).
SERVICE_ACCOUNT_CLAIM = "service_account"


class Unauthenticated(RunqError):
    """No credentials, or credentials that do not verify (HTTP 401)."""


class Forbidden(RunqError):
    """Authenticated, but not allowed to do this (HTTP 403)."""


@dataclass(frozen=True)
class Identity:
    """The caller of one request, as the authenticator established it."""

    user_id: str | None
    service_account: bool
    scopes: tuple[str, ...]
    is_admin: bool
    is_approver: bool
    #: "open", "key" or "jwt": /queue is refused to a JWT identity without the admin scope.
    mode: str

    @property
    def actor(self) -> Actor:
        """What is frozen on a run this caller submits."""
        return Actor(user_id=self.user_id, service_account=self.service_account, scopes=self.scopes)

    def owns(self, run: Run) -> bool:
        # A run without a user (open mode) belongs to nobody in particular: only admins and
        # approvers see it, or any token subject could claim it. Neither does a run a service
        # account submitted (the CLI records its runs under "cli"): a token whose subject
        # happens to be that name must not borrow the service account's runs. Nor the other
        # way round: a service account whose subject is a person's id is not that person.
        return (
            self.user_id is not None
            and not self.service_account
            and not run.actor.service_account
            and run.user_id == self.user_id
        )

    def can_see(self, run: Run) -> bool:
        return self.is_admin or self.is_approver or self.owns(run)

    def can_read_content(self, run: Run) -> bool:
        """Payload and answer: admins and the run's own user, never a mere approver."""
        return self.is_admin or self.owns(run)

    def can_cancel(self, run: Run) -> bool:
        return self.is_admin or self.owns(run)

    def can_continue(self, run: Run) -> bool:
        return self.is_admin or self.is_approver or self.owns(run)


ANONYMOUS_ADMIN = Identity(
    user_id=None, service_account=False, scopes=(), is_admin=True, is_approver=True, mode="open"
)
KEY_HOLDER = Identity(
    user_id=None, service_account=True, scopes=(), is_admin=True, is_approver=True, mode="key"
)


class Authenticator(Protocol):
    mode: str

    def authenticate(self, authorization: str | None) -> Identity:
        """The identity behind an ``Authorization`` header value; raises ``Unauthenticated``."""
        ...


def bearer_token(authorization: str | None) -> str:
    """The credentials of ``Authorization: Bearer <credentials>`` (scheme case-insensitive)."""
    if not authorization:
        raise Unauthenticated("missing Authorization: Bearer credentials")
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        raise Unauthenticated("the Authorization header must be 'Bearer <credentials>'")
    return credentials.strip()


class OpenAuth:
    """No authentication: the caller is an anonymous admin (loopback by default)."""

    mode = "open"

    def authenticate(self, authorization: str | None) -> Identity:
        return ANONYMOUS_ADMIN


class KeyAuth:
    """One shared bearer key; its holder is an admin service account."""

    mode = "key"

    def __init__(self, key: str) -> None:
        if not key:
            raise ConfigError("http.key", "the API key is empty")
        # Compare digests, not the keys: equal-length inputs keep compare_digest from
        # leaking the key's length through timing.
        self._digest = hashlib.sha256(key.encode()).digest()

    def authenticate(self, authorization: str | None) -> Identity:
        presented = hashlib.sha256(bearer_token(authorization).encode()).digest()
        if not hmac.compare_digest(presented, self._digest):
            raise Unauthenticated("the API key is not valid")
        return KEY_HOLDER


class JwtAuth:
    """PyJWT verification with the configured algorithms, key, issuer, audience, leeway."""

    mode = "jwt"

    def __init__(self, config: JwtConfig, key: str) -> None:
        self._config = config
        self._key = key
        self._algorithms = list(config.algorithms)

    def authenticate(self, authorization: str | None) -> Identity:
        claims = self._decode(bearer_token(authorization))
        subject = checked_subject(claims.get("sub"))
        scopes = scopes_from_claim(claims.get(self._config.scopes_claim))
        is_admin = self._config.admin_scope in scopes
        return Identity(
            user_id=subject,
            service_account=claims.get(SERVICE_ACCOUNT_CLAIM) is True,
            scopes=scopes,
            is_admin=is_admin,
            is_approver=is_admin or self._config.approve_scope in scopes,
            mode="jwt",
        )

    def _decode(self, token: str) -> dict[str, Any]:
        c = self._config
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                self._key,
                algorithms=self._algorithms,
                audience=c.audience or None,
                issuer=c.issuer or None,
                leeway=c.leeway_seconds,
                # Without a configured audience PyJWT would refuse any token that carries
                # one; "" means "not checked", as documented for the key.
                options={"require": ["exp", "sub"], "verify_aud": bool(c.audience)},
            )
        except jwt.ExpiredSignatureError as e:
            raise Unauthenticated("the token has expired") from e
        except jwt.InvalidAudienceError as e:
            raise Unauthenticated("the token's audience is not accepted") from e
        except jwt.InvalidIssuerError as e:
            raise Unauthenticated("the token's issuer is not accepted") from e
        except jwt.InvalidSignatureError as e:
            raise Unauthenticated("the token's signature does not verify") from e
        except jwt.MissingRequiredClaimError as e:
            raise Unauthenticated(f"the token lacks the {e.claim!r} claim") from e
        except jwt.ImmatureSignatureError as e:
            raise Unauthenticated("the token is not valid yet") from e
        except jwt.InvalidTokenError as e:
            # Malformed, wrong algorithm, bad claim types: PyJWT's messages name the
            # problem and never echo the token.
            raise Unauthenticated(f"the token is not valid: {e}") from e
        return claims


def checked_subject(subject: object) -> str:
    """The ``sub`` claim as a user id: printable text, no surrounding spaces, bounded length."""
    if not isinstance(subject, str) or not subject:
        raise Unauthenticated("the token's 'sub' claim must be a non-empty string")
    if len(subject) > MAX_SUBJECT_CHARS:
        raise Unauthenticated(
            f"the token's 'sub' claim is longer than {MAX_SUBJECT_CHARS} characters"
        )
    # isprintable refuses control characters (C0, DEL, C1) and invisible format characters
    # such as bidi overrides, which could make one user id look like another.
    if not subject.isprintable() or subject != subject.strip():
        raise Unauthenticated(
            "the token's 'sub' claim must be printable text without control characters "
            "or surrounding spaces"
        )
    return subject


def scopes_from_claim(value: object) -> tuple[str, ...]:
    """A space-separated string (OAuth ``scope``) or a list of strings (``scp``, ``roles``)."""
    if isinstance(value, str):
        return tuple(value.split())
    if isinstance(value, list | tuple):
        return tuple(s for s in value if isinstance(s, str) and s)
    return ()


def build_authenticator(http: HttpConfig) -> Authenticator:
    """The authenticator for ``[http]``; reads secrets now so a bad reference stops the start."""
    if http.auth == "open":
        _refuse_open_on_public(http)
        return OpenAuth()
    if http.auth == "key":
        key = read_secret(http.key, key_name="http.key")
        if len(key) < SHORT_KEY_CHARS:
            log.warning(
                "http.key is shorter than %d characters; use a long random key", SHORT_KEY_CHARS
            )
        return KeyAuth(key)
    if http.auth == "jwt":
        return JwtAuth(http.jwt, _jwt_key(http.jwt))
    raise ConfigError("http.auth", f"{http.auth!r} is not one of open, key, jwt")


def _refuse_open_on_public(http: HttpConfig) -> None:
    if not http.listen or http.allow_open_on_public:
        return
    host, _ = split_listen(http.listen)
    if not is_loopback(host):
        raise ConfigError(
            "http.auth",
            f"'open' on the non-loopback address {host!r} is refused; use 'key' or 'jwt', "
            "or set http.allow_open_on_public = true",
        )


def _jwt_key(config: JwtConfig) -> str:
    """The HMAC secret for HS*, or the PEM public key for RS*/ES* (parsed now to fail early)."""
    if all(alg.startswith("HS") for alg in config.algorithms):
        secret = read_secret(config.secret, key_name="http.jwt.secret")
        needed = max(HMAC_MIN_SECRET_BYTES.get(alg, 32) for alg in config.algorithms)
        if len(secret.encode()) < needed:
            raise ConfigError(
                "http.jwt.secret",
                f"the secret is {len(secret.encode())} bytes; {'/'.join(config.algorithms)} "
                f"needs at least {needed} (a short HMAC secret can be guessed offline from "
                "any one token)",
            )
        return secret
    pem = read_secret(config.public_key, key_name="http.jwt.public_key")
    try:
        load_pem_public_key(pem.encode())
    except ValueError as e:
        raise ConfigError("http.jwt.public_key", "is not a PEM public key") from e
    return pem
