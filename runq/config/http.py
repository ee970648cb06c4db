"""``[http]`` and ``[http.jwt]``: the API's listener, auth and browser rules."""

from __future__ import annotations

import ipaddress
import re

import msgspec

from runq.config.checks import SECRET_REF_RE, require
from runq.errors import ConfigError

AUTH_MODES = ("open", "key", "jwt")

JWT_ALGORITHMS = ("HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "ES256", "ES384", "ES512")


class JwtConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    secret: str = "env:RUNQ_JWT_SECRET"
    public_key: str = ""
    algorithms: tuple[str, ...] = ("HS256",)
    issuer: str = ""
    audience: str = ""
    leeway_seconds: float = 30.0
    scopes_claim: str = "scope"
    admin_scope: str = "runq:admin"
    approve_scope: str = "runq:approve"


class HttpConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    listen: str = "127.0.0.1:7777"
    auth: str = "open"
    allow_open_on_public: bool = False
    key: str = "env:RUNQ_API_KEY"
    max_body_bytes: int = 1_048_576
    #: A request's headers and body must arrive within this (slow clients are cut off).
    request_timeout_seconds: float = 30.0
    #: Host names clients use besides the listen host, localhost and IP addresses ("*": any).
    allowed_hosts: tuple[str, ...] = ()
    #: The priorities a caller without the admin scope may ask for, inclusive.
    user_priority_range: tuple[int, int] = (0, 100)
    jwt: JwtConfig = JwtConfig()

    @property
    def host_port(self) -> tuple[str, int] | None:
        return split_listen(self.listen) if self.listen else None


def split_listen(listen: str) -> tuple[str, int]:
    host, sep, port_text = listen.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError("http.listen", f"{listen!r} is not 'host:port' (e.g. '127.0.0.1:7777')")
    return host.strip("[]"), int(port_text)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: A host name, an IPv4 address or a bracketed IPv6 address, optionally with a port; or "*".
_ALLOWED_HOST_RE = re.compile(
    r"\*|[A-Za-z0-9._-]+(:\d{1,5})?|\[[0-9A-Fa-f:.]+\](:\d{1,5})?|[0-9A-Fa-f:.]+"
)


def validate_http(h: HttpConfig) -> None:
    require(h.auth in AUTH_MODES, "http.auth", f"{h.auth!r} is not one of {', '.join(AUTH_MODES)}")
    require(h.max_body_bytes >= 1024, "http.max_body_bytes", "must be at least 1024")
    require(h.request_timeout_seconds > 0, "http.request_timeout_seconds", "must be > 0")
    for host in h.allowed_hosts:
        require(
            _ALLOWED_HOST_RE.fullmatch(host) is not None,
            "http.allowed_hosts",
            f"{host[:100]!r} is not a host name or address (no scheme, path or spaces)",
        )
    low, high = h.user_priority_range
    require(
        -1_000_000 <= low <= high <= 1_000_000,
        "http.user_priority_range",
        "must be [low, high] with low <= high, both within -1000000..1000000",
    )
    if h.listen:
        host, _ = split_listen(h.listen)
        if h.auth == "open" and not is_loopback(host) and not h.allow_open_on_public:
            raise ConfigError(
                "http.auth",
                f"'open' on the non-loopback address {host!r} is refused; use 'key' or 'jwt', "
                "or set http.allow_open_on_public = true",
            )
    if h.auth == "key":
        require(
            bool(SECRET_REF_RE.match(h.key)),
            "http.key",
            f"{h.key!r} must be 'env:NAME' or 'file:/path'",
        )
    if h.auth == "jwt":
        j = h.jwt
        require(bool(j.algorithms), "http.jwt.algorithms", "must name at least one algorithm")
        for alg in j.algorithms:
            require(
                alg in JWT_ALGORITHMS,
                "http.jwt.algorithms",
                f"{alg!r} is not one of {', '.join(JWT_ALGORITHMS)}",
            )
        symmetric = {a.startswith("HS") for a in j.algorithms}
        require(
            len(symmetric) == 1, "http.jwt.algorithms", "do not mix HS* with RS*/ES* algorithms"
        )
        if symmetric == {True}:
            require(
                bool(SECRET_REF_RE.match(j.secret)),
                "http.jwt.secret",
                f"{j.secret!r} must be 'env:NAME' or 'file:/path'",
            )
        else:
            require(
                bool(SECRET_REF_RE.match(j.public_key)),
                "http.jwt.public_key",
                "RS*/ES* algorithms need public_key = 'file:/path' (or 'env:NAME')",
            )
        require(j.leeway_seconds >= 0, "http.jwt.leeway_seconds", "must be >= 0")
        require(bool(j.scopes_claim), "http.jwt.scopes_claim", "must not be empty")
