"""TOML + environment → one frozen ``Config``. Every error names the key.

Order: built-in defaults, then the file (``--config FILE``, else ``RUNQ_CONFIG``), then
``RUNQ_<SECTION>_<KEY>`` variables for known keys (``RUNQ_STORE_URL``,
``RUNQ_HTTP_JWT_SECRET``); other ``RUNQ_*`` variables are ignored. An unknown key in the
file is an error that suggests the nearest known one.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec
from croniter import croniter

from runq.errors import ConfigError
from runq.model import COMPONENT_TYPES

TRANSPORTS = ("sync", "local", "postgres")
PRIVACY_LEVELS = ("none", "metadata", "redacted", "full")
AUTH_MODES = ("open", "key", "jwt")
JWT_ALGORITHMS = ("HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "ES256", "ES384", "ES512")
BUDGET_SCOPES = ("user", "configuration", "both")
BUDGET_PERIODS = ("day", "month")
COMPONENT_KINDS = ("http", "openai-chat")
SCHEDULE_OVERLAPS = ("allow", "skip")
SCHEDULE_CATCH_UPS = ("latest", "none", "all")
_SCHEDULE_NAME_RE = re.compile(r"^[A-Za-z0-9][\w.\-]{0,99}$")
_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_HANDLER_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
_SECRET_REF_RE = re.compile(r"^(env:[A-Za-z_]\w*|file:.+)$")

# Defaults that are not configuration keys but are shared by a service and a command; like
# every other default they are written here only, and the services read them through their
# ``from_config``.

#: Stale runs settled per reaper pass (``[reaper] limit``, ``runq reap --limit``).
REAP_LIMIT = 50
#: ``runq work``: at most this many runs per sweep, and no new claim after this many seconds.
SWEEP_LIMIT = 50
SWEEP_TIME_LIMIT_SECONDS = 60.0
#: A worker counts as live while its last heartbeat is younger than this many heartbeat
#: intervals: two may fail without the worker flickering dead, and a killed worker stops
#: counting within one lock grace (``runq status``, /metrics, the console).
LIVE_WORKER_HEARTBEATS = 3
#: Worker rows not seen for this long are deleted, checked this often.
WORKER_ROW_MAX_AGE_SECONDS = 86400.0
WORKER_PRUNE_INTERVAL_SECONDS = 3600.0


class StoreConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    url: str = "sqlite:///runq.db"
    schema: str = "runq"
    #: PostgreSQL: connections of the shared pool (API, completions, heartbeats, maintenance).
    #: A replica opens at most this many, plus one for claims and one for LISTEN.
    pool_size: int = 10
    #: PostgreSQL behind PgBouncer in transaction mode: no server-side prepared statements,
    #: and LISTEN only on ``listen_url`` (poll-only without one).
    pgbouncer: bool = False
    #: PostgreSQL: a direct URL (not through a pooler) for LISTEN wake-ups; empty: ``url``,
    #: or no LISTEN at all when ``pgbouncer`` is on.
    listen_url: str = ""


class QueueConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    max_attempts: int = 1
    retry_delay_seconds: float = 30.0
    timeout_seconds: float = 3600.0
    lock_grace_seconds: float = 60.0
    stop_timeout_seconds: float | None = None
    poll_interval: float = 1.0
    max_concurrency: int = 32
    max_queue_depth: int = 1000
    #: Queued runs not yet due (delayed) have their own bound: they never count against
    #: ``max_queue_depth``, so runs delayed far into the future cannot fill the queue.
    max_delayed: int = 10000
    #: One user's queued runs (0 = unbounded): no user can fill the queue for everyone.
    max_queued_per_user: int = 0
    retention_seconds: float = 86400.0
    paused_retention_seconds: float = 0.0
    retention_interval_seconds: float = 3600.0
    deployment_id: str = ""
    serialize_sessions: bool = True
    worker: bool = True

    @property
    def heartbeat_interval(self) -> float:
        return self.lock_grace_seconds / 3

    @property
    def live_worker_seconds(self) -> float:
        """A worker seen (heartbeat) within this many seconds counts as live."""
        return LIVE_WORKER_HEARTBEATS * self.heartbeat_interval

    @property
    def effective_stop_timeout(self) -> float:
        if self.stop_timeout_seconds is not None:
            return self.stop_timeout_seconds
        return min(30.0, self.lock_grace_seconds - 1)

    @property
    def deployment(self) -> str | None:
        return self.deployment_id or None


class ReaperConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    limit: int = REAP_LIMIT


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


class SealConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    keys: tuple[str, ...] = ()


class CliConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    service_account: str = "cli"


class BudgetLimit(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    scope: str = "user"
    period: str = "day"
    max_cost: float | None = None
    max_tokens: int | None = None
    max_runs: int | None = None


class BudgetConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    timezone: str = "UTC"
    limits: tuple[BudgetLimit, ...] = ()


class PrivacyConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    level: str = "metadata"
    redacted_max_chars: int = 4000


class ScheduleConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One ``[[schedules]]`` entry: submit a run of ``component`` at every cron slot."""

    name: str
    #: Five fields (minute precision) or six with seconds first.
    cron: str
    component: str
    timezone: str = "UTC"
    payload: Any = None
    priority: int = 0
    max_attempts: int | None = None
    deployment_id: str = ""
    #: "skip": no run for a slot while the schedule's previous run is not final.
    overlap: str = "allow"
    #: Slots missed by more than ``grace_seconds`` (the fleet was down): "latest" fires the
    #: most recent one, "none" drops them, "all" fires up to ``catch_up_max`` of them.
    catch_up: str = "latest"
    catch_up_max: int = 10
    #: A slot this late still counts as on time and fires whatever ``catch_up`` says.
    grace_seconds: float = 10.0

    @property
    def has_seconds(self) -> bool:
        return len(self.cron.split()) == 6

    @property
    def component_type(self) -> str:
        return self.component.partition("/")[0]

    @property
    def component_id(self) -> str:
        return self.component.partition("/")[2]


class LimitConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``[limits."pattern"]``: fleet-wide admission rules for the components it matches."""

    #: Runs of the matched components running at once across every replica.
    max_running: int | None = None
    #: Runs sharing one ``concurrency_key`` running at once (runs without a key are free).
    max_running_per_key: int | None = None
    #: Starts per period, ``"N/second"``, ``"N/minute"`` or ``"N/hour"``.
    rate: str | None = None


class Config(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    store: StoreConfig = StoreConfig()
    queue: QueueConfig = QueueConfig()
    reaper: ReaperConfig = ReaperConfig()
    http: HttpConfig = HttpConfig()
    seal: SealConfig = SealConfig()
    cli: CliConfig = CliConfig()
    budget: BudgetConfig = BudgetConfig()
    privacy: PrivacyConfig = PrivacyConfig()
    routing: dict[str, str] = {}
    components: dict[str, str | dict[str, Any]] = {}
    schedules: tuple[ScheduleConfig, ...] = ()
    limits: dict[str, LimitConfig] = {}

    def with_store_url(self, url: str) -> Config:
        return msgspec.structs.replace(self, store=msgspec.structs.replace(self.store, url=url))


#: Sections whose keys are free-form (maps), not fixed fields.
_FREE_SECTIONS = frozenset({"routing", "components", "schedules", "limits"})


def _struct_fields(struct_type: type[msgspec.Struct]) -> dict[str, Any]:
    return {f.name: f.type for f in msgspec.structs.fields(struct_type)}


def _known_keys() -> dict[str, type[msgspec.Struct] | None]:
    """Dotted section name → its Struct (None for free-form maps)."""
    sections: dict[str, type[msgspec.Struct] | None] = {}
    for name, typ in _struct_fields(Config).items():
        if name in _FREE_SECTIONS:
            sections[name] = None
        else:
            sections[name] = typ
    sections["http.jwt"] = JwtConfig
    return sections


def _suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(sorted(options))}"


def _check_unknown_keys(data: Mapping[str, Any]) -> None:
    sections = _known_keys()
    top = [s for s in sections if "." not in s]
    for name, value in data.items():
        if name not in sections:
            raise ConfigError(name, f"unknown section{_suggest(name, top)}")
        struct = sections[name]
        if name == "schedules" and isinstance(value, list):
            # An array of tables: each entry is checked against ScheduleConfig by index.
            for i, entry in enumerate(value):
                if isinstance(entry, Mapping):
                    _check_table(f"schedules[{i}]", entry, ScheduleConfig)
            continue
        if struct is None:
            _check_free_section(name, value)
            continue
        if name == "budget" and isinstance(value, Mapping):
            # Not a list: decoding names ``budget.limits`` and says what it expected.
            limits = value.get("limits")
            for i, limit in enumerate(limits if isinstance(limits, list) else []):
                if isinstance(limit, Mapping):
                    _check_table(f"budget.limits[{i}]", limit, BudgetLimit)
        if isinstance(value, Mapping):
            _check_table(name, value, struct)


def _check_free_section(name: str, table: Any) -> None:
    """Value types of the free-form maps, checked here because msgspec's error for a bad map
    value says ``components[...]`` and would not name the entry."""
    if not isinstance(table, Mapping):
        return  # decoding reports "expected object" at the section itself
    for entry, value in table.items():
        key = f'{name}."{entry}"'
        if name == "routing" and not isinstance(value, str):
            raise ConfigError(key, f"must be a transport name ({', '.join(TRANSPORTS)})")
        if name == "components" and not isinstance(value, str | Mapping):
            raise ConfigError(key, "must be 'module:function' or a table with a kind")
        if name == "limits":
            if not isinstance(value, Mapping):
                raise ConfigError(key, "must be a table (max_running, max_running_per_key, rate)")
            _check_table(key, value, LimitConfig)
            _check_limit_types(key, value)


def _check_limit_types(key: str, table: Mapping[str, Any]) -> None:
    """Named here: msgspec's own message would say ``limits[...]``."""
    for name in ("max_running", "max_running_per_key"):
        value = table.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{key}.{name}", f"{value!r} must be a whole number")
    rate = table.get("rate")
    if rate is not None and not isinstance(rate, str):
        raise ConfigError(f"{key}.rate", f"{rate!r} must be a string like '100/minute'")


def _check_table(prefix: str, table: Mapping[str, Any], struct: type[msgspec.Struct]) -> None:
    fields = list(_struct_fields(struct))
    for key, value in table.items():
        if key not in fields:
            raise ConfigError(f"{prefix}.{key}", f"unknown key{_suggest(key, fields)}")
        if prefix == "http" and key == "jwt" and isinstance(value, Mapping):
            _check_table("http.jwt", value, JwtConfig)


def _env_overrides(environ: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """``RUNQ_<SECTION>_<KEY>`` for known scalar/list keys only; others are ignored."""
    found: dict[str, dict[str, str]] = {}
    for section, struct in _known_keys().items():
        if struct is None:
            continue
        for key, typ in _struct_fields(struct).items():
            if isinstance(typ, type) and issubclass(typ, msgspec.Struct):
                continue
            env_name = "RUNQ_" + f"{section}_{key}".replace(".", "_").upper()
            if env_name in environ:
                found.setdefault(section, {})[key] = environ[env_name]
    return found


def _coerce_env(section: str, key: str, raw: str) -> Any:
    struct = _known_keys()[section]
    assert struct is not None
    typ = _struct_fields(struct)[key]
    text = str(typ)
    if "tuple" in text or "list" in text:
        raw = raw.strip()
        if raw.startswith("["):
            try:
                return msgspec.json.decode(raw)
            except msgspec.DecodeError as e:
                raise ConfigError(
                    f"{section}.{key}", f"environment value is not a JSON list: {e}"
                ) from e
        return [part.strip() for part in raw.split(",") if part.strip()]
    if typ is bool:
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{section}.{key}", f"{raw!r} is not a boolean (true/false)")
    if typ is int or typ is float or "float" in text or "int" in text:
        try:
            number = float(raw)
        except ValueError as e:
            raise ConfigError(f"{section}.{key}", f"{raw!r} is not a number") from e
        return int(number) if typ is int and number.is_integer() else number
    return raw


def _merge(data: dict[str, Any], overrides: dict[str, dict[str, str]]) -> dict[str, Any]:
    merged = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in data.items()}
    for section, values in overrides.items():
        parts = section.split(".")
        target = merged
        for part in parts:
            nxt = target.get(part)
            if not isinstance(nxt, dict):
                nxt = {}
                target[part] = nxt
            else:
                nxt = dict(nxt)
                target[part] = nxt
            target = nxt
        for key, raw in values.items():
            target[key] = _coerce_env(section, key, raw)
    return merged


_PATH_RE = re.compile(r"at `\$\.?(?P<path>[^`]*)`")


def _decode(data: Mapping[str, Any]) -> Config:
    try:
        return msgspec.convert(data, Config, strict=False)
    except msgspec.ValidationError as e:
        message = str(e)
        match = _PATH_RE.search(message)
        key = match.group("path") if match else "config"
        key = re.sub(r"\[(\d+)\]", r"[\1]", key) or "config"
        reason = _PATH_RE.sub("", message).rstrip(" -")
        raise ConfigError(key, reason) from e


def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    store_url: str | None = None,
) -> Config:
    """Load and validate. ``path`` None falls back to ``RUNQ_CONFIG``, then to defaults."""
    env = os.environ if environ is None else environ
    file_path = path if path is not None else env.get("RUNQ_CONFIG") or None
    data: dict[str, Any] = {}
    if file_path is not None:
        data = read_toml(Path(file_path))
        _check_unknown_keys(data)
    data = _merge(data, _env_overrides(env))
    config = _decode(data)
    if store_url:
        config = config.with_store_url(store_url)
    validate(config)
    return config


def read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ConfigError("--config", f"{path}: no such file") from e
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("--config", f"{path}: cannot read ({e})") from e
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("--config", f"{path}: not valid TOML ({e})") from e


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


def store_engine(url: str) -> str:
    if url.startswith("sqlite:///") or url == "sqlite://:memory:":
        return "sqlite"
    if url.startswith(("postgresql://", "postgres://")):
        return "postgres"
    raise ConfigError(
        "store.url",
        f"{redact_url(url)!r} is neither 'sqlite:///path.db' nor 'postgresql://user@host:port/db'",
    )


def redact_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)


# -- validation ----------------------------------------------------------------------------


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(key, message)


def validate(config: Config) -> None:
    _validate_finite(config)
    _validate_store(config.store)
    _validate_queue(config.queue)
    q = config.reaper
    _require(1 <= q.limit <= 10_000, "reaper.limit", f"{q.limit} must be between 1 and 10000")
    _validate_http(config.http)
    for i, ref in enumerate(config.seal.keys):
        _require(
            bool(_SECRET_REF_RE.match(ref)),
            f"seal.keys[{i}]",
            f"{ref!r} must be 'env:NAME' or 'file:/path'",
        )
    _require(bool(config.cli.service_account.strip()), "cli.service_account", "must not be empty")
    _validate_budget(config.budget)
    p = config.privacy
    _require(
        p.level in PRIVACY_LEVELS,
        "privacy.level",
        f"{p.level!r} is not one of {', '.join(PRIVACY_LEVELS)}",
    )
    _require(p.redacted_max_chars >= 16, "privacy.redacted_max_chars", "must be at least 16")
    _validate_routing(config)
    _validate_components(config.components)
    _validate_schedules(config.schedules)
    _validate_limits(config.limits)


def _validate_finite(config: Config) -> None:
    """TOML has ``inf`` and ``nan``, but no setting means them: an infinite lease grace or
    retry delay would leave runs running or queued forever."""
    structs: dict[str, msgspec.Struct] = {
        "queue": config.queue,
        "http": config.http,
        "http.jwt": config.http.jwt,
        **{f"budget.limits[{i}]": limit for i, limit in enumerate(config.budget.limits)},
    }
    for prefix, struct in structs.items():
        for f in msgspec.structs.fields(struct):
            value = getattr(struct, f.name)
            if isinstance(value, float):
                _require(math.isfinite(value), f"{prefix}.{f.name}", "must be a finite number")


def _validate_store(s: StoreConfig) -> None:
    store_engine(s.url)
    _require(
        bool(_SCHEMA_RE.match(s.schema)),
        "store.schema",
        f"{s.schema!r} must be a lower-case SQL identifier ([a-z_][a-z0-9_]*)",
    )
    _require(1 <= s.pool_size <= 1000, "store.pool_size", f"{s.pool_size} must be 1 to 1000")
    if s.listen_url:
        _require(
            store_engine(s.listen_url) == "postgres", "store.listen_url", "must be postgresql://"
        )


def _validate_queue(q: QueueConfig) -> None:
    _require(q.max_attempts >= 1, "queue.max_attempts", f"{q.max_attempts} must be >= 1")
    _require(q.retry_delay_seconds >= 0, "queue.retry_delay_seconds", "must be >= 0")
    _require(q.timeout_seconds > 0, "queue.timeout_seconds", "must be > 0")
    _require(
        q.lock_grace_seconds >= 3,
        "queue.lock_grace_seconds",
        f"{q.lock_grace_seconds} must be >= 3",
    )
    if q.stop_timeout_seconds is not None:
        _require(
            0 <= q.stop_timeout_seconds < q.lock_grace_seconds,
            "queue.stop_timeout_seconds",
            (
                f"{q.stop_timeout_seconds} must be >= 0 and "
                f"< queue.lock_grace_seconds ({q.lock_grace_seconds})"
            ),
        )
    _require(q.poll_interval > 0, "queue.poll_interval", f"{q.poll_interval} must be > 0")
    _require(
        1 <= q.max_concurrency <= 10_000, "queue.max_concurrency", "must be between 1 and 10000"
    )
    _require(q.max_queue_depth >= 0, "queue.max_queue_depth", "must be >= 0 (0 = unbounded)")
    _require(q.max_delayed >= 0, "queue.max_delayed", "must be >= 0 (0 = unbounded)")
    _require(
        q.max_queued_per_user >= 0, "queue.max_queued_per_user", "must be >= 0 (0 = unbounded)"
    )
    _require(q.retention_seconds > 0, "queue.retention_seconds", "must be > 0")
    _require(q.paused_retention_seconds >= 0, "queue.paused_retention_seconds", "must be >= 0")
    _require(q.retention_interval_seconds > 0, "queue.retention_interval_seconds", "must be > 0")
    _require(len(q.deployment_id) <= 200, "queue.deployment_id", "must be at most 200 characters")


#: A host name, an IPv4 address or a bracketed IPv6 address, optionally with a port; or "*".
_ALLOWED_HOST_RE = re.compile(
    r"\*|[A-Za-z0-9._-]+(:\d{1,5})?|\[[0-9A-Fa-f:.]+\](:\d{1,5})?|[0-9A-Fa-f:.]+"
)


def _validate_http(h: HttpConfig) -> None:
    _require(h.auth in AUTH_MODES, "http.auth", f"{h.auth!r} is not one of {', '.join(AUTH_MODES)}")
    _require(h.max_body_bytes >= 1024, "http.max_body_bytes", "must be at least 1024")
    _require(h.request_timeout_seconds > 0, "http.request_timeout_seconds", "must be > 0")
    for host in h.allowed_hosts:
        _require(
            _ALLOWED_HOST_RE.fullmatch(host) is not None,
            "http.allowed_hosts",
            f"{host[:100]!r} is not a host name or address (no scheme, path or spaces)",
        )
    low, high = h.user_priority_range
    _require(
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
        _require(
            bool(_SECRET_REF_RE.match(h.key)),
            "http.key",
            f"{h.key!r} must be 'env:NAME' or 'file:/path'",
        )
    if h.auth == "jwt":
        j = h.jwt
        _require(bool(j.algorithms), "http.jwt.algorithms", "must name at least one algorithm")
        for alg in j.algorithms:
            _require(
                alg in JWT_ALGORITHMS,
                "http.jwt.algorithms",
                f"{alg!r} is not one of {', '.join(JWT_ALGORITHMS)}",
            )
        symmetric = {a.startswith("HS") for a in j.algorithms}
        _require(
            len(symmetric) == 1, "http.jwt.algorithms", "do not mix HS* with RS*/ES* algorithms"
        )
        if symmetric == {True}:
            _require(
                bool(_SECRET_REF_RE.match(j.secret)),
                "http.jwt.secret",
                f"{j.secret!r} must be 'env:NAME' or 'file:/path'",
            )
        else:
            _require(
                bool(_SECRET_REF_RE.match(j.public_key)),
                "http.jwt.public_key",
                "RS*/ES* algorithms need public_key = 'file:/path' (or 'env:NAME')",
            )
        _require(j.leeway_seconds >= 0, "http.jwt.leeway_seconds", "must be >= 0")
        _require(bool(j.scopes_claim), "http.jwt.scopes_claim", "must not be empty")


def _validate_budget(b: BudgetConfig) -> None:
    try:
        ZoneInfo(b.timezone)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise ConfigError("budget.timezone", f"{b.timezone!r} is not a known IANA time zone") from e
    for i, limit in enumerate(b.limits):
        key = f"budget.limits[{i}]"
        _require(
            limit.scope in BUDGET_SCOPES,
            f"{key}.scope",
            f"{limit.scope!r} is not one of {', '.join(BUDGET_SCOPES)}",
        )
        _require(
            limit.period in BUDGET_PERIODS,
            f"{key}.period",
            f"{limit.period!r} is not one of {', '.join(BUDGET_PERIODS)}",
        )
        caps = (limit.max_cost, limit.max_tokens, limit.max_runs)
        _require(
            any(c is not None for c in caps),
            key,
            "needs at least one of max_cost, max_tokens, max_runs",
        )
        for name, cap in zip(("max_cost", "max_tokens", "max_runs"), caps, strict=True):
            _require(cap is None or cap >= 0, f"{key}.{name}", "must be >= 0")


def _validate_routing(config: Config) -> None:
    engine = store_engine(config.store.url)
    for pattern, transport in config.routing.items():
        key = f'routing."{pattern}"'
        _require(
            transport in TRANSPORTS, key, f"{transport!r} is not one of {', '.join(TRANSPORTS)}"
        )
        _require(
            is_component_pattern(pattern),
            key,
            "a pattern is '*', 'type/*' or 'type/id'",
        )
        if transport == "postgres":
            _require(
                engine == "postgres", key, "the postgres transport needs a PostgreSQL store.url"
            )


#: A component pattern as in ``[routing]`` and ``[limits]``: ``*``, ``type/*``, ``type/id``.
COMPONENT_PATTERN_RE = re.compile(r"^[a-z]+/(\*|[\w.\-*]+)$")
#: Seconds per rate period.
RATE_PERIODS = {"second": 1.0, "minute": 60.0, "hour": 3600.0}
_RATE_RE = re.compile(r"^\s*(\d+)\s*/\s*(second|minute|hour)\s*$")


def parse_rate(text: str) -> tuple[int, float]:
    """``"100/minute"`` → (100, 60.0); ValueError for anything else."""
    m = _RATE_RE.match(text)
    if m is None or int(m.group(1)) < 1:
        raise ValueError(f"{text!r} is not 'N/second', 'N/minute' or 'N/hour' with N >= 1")
    return int(m.group(1)), RATE_PERIODS[m.group(2)]


def is_component_pattern(pattern: str) -> bool:
    return pattern == "*" or bool(COMPONENT_PATTERN_RE.match(pattern))


def _validate_limits(limits: Mapping[str, LimitConfig]) -> None:
    for pattern, limit in limits.items():
        key = f'limits."{pattern}"'
        _require(is_component_pattern(pattern), key, "a pattern is '*', 'type/*' or 'type/id'")
        _require(
            limit.max_running is not None
            or limit.max_running_per_key is not None
            or limit.rate is not None,
            key,
            "set max_running, max_running_per_key or rate",
        )
        for name in ("max_running", "max_running_per_key"):
            value = getattr(limit, name)
            _require(
                value is None or 1 <= value <= 1_000_000,
                f"{key}.{name}",
                f"{value} must be between 1 and 1000000",
            )
        if limit.rate is not None:
            try:
                parse_rate(limit.rate)
            except ValueError as e:
                raise ConfigError(f"{key}.rate", str(e)) from e


def _validate_components(components: Mapping[str, Any]) -> None:
    for name, spec in components.items():
        key = f'components."{name}"'
        ctype, sep, cid = name.partition("/")
        _require(
            bool(sep and cid) and ctype in COMPONENT_TYPES,
            key,
            f"a component is 'type/id' with type one of {', '.join(sorted(COMPONENT_TYPES))}",
        )
        if isinstance(spec, str):
            _require(bool(_HANDLER_RE.match(spec)), key, f"{spec!r} is not 'module:function'")
        else:
            kind = spec.get("kind")
            _require(
                kind in COMPONENT_KINDS,
                f"{key}.kind",
                f"{kind!r} is not one of {', '.join(COMPONENT_KINDS)}",
            )


def _validate_schedules(schedules: tuple[ScheduleConfig, ...]) -> None:
    """Each ``[[schedules]]`` entry on its own; whether its component exists is checked at
    start, where the component registry is known."""
    seen: set[str] = set()
    for i, sch in enumerate(schedules):
        key = f"schedules[{i}]"
        _require(
            bool(_SCHEDULE_NAME_RE.match(sch.name)),
            f"{key}.name",
            f"{sch.name[:100]!r} must be 1-100 letters, digits, '_', '-' or '.'",
        )
        _require(sch.name not in seen, f"{key}.name", f"{sch.name!r} is used twice")
        seen.add(sch.name)
        fields = len(sch.cron.split())
        _require(
            fields in (5, 6) and croniter.is_valid(sch.cron, second_at_beginning=fields == 6),
            f"{key}.cron",
            f"{sch.cron[:100]!r} is not a cron expression of five fields"
            " (or six with seconds first)",
        )
        try:
            ZoneInfo(sch.timezone)
        except (ZoneInfoNotFoundError, ValueError) as e:
            raise ConfigError(
                f"{key}.timezone", f"{sch.timezone[:100]!r} is not a known IANA time zone"
            ) from e
        ctype, sep, cid = sch.component.partition("/")
        _require(
            bool(sep and cid) and ctype in COMPONENT_TYPES,
            f"{key}.component",
            f"a component is 'type/id' with type one of {', '.join(sorted(COMPONENT_TYPES))}",
        )
        _require(
            sch.overlap in SCHEDULE_OVERLAPS,
            f"{key}.overlap",
            f"{sch.overlap!r} is not one of {', '.join(SCHEDULE_OVERLAPS)}",
        )
        _require(
            sch.catch_up in SCHEDULE_CATCH_UPS,
            f"{key}.catch_up",
            f"{sch.catch_up!r} is not one of {', '.join(SCHEDULE_CATCH_UPS)}",
        )
        _require(1 <= sch.catch_up_max <= 1000, f"{key}.catch_up_max", "must be between 1 and 1000")
        _require(
            # Below a second, a pass that is a little late would count an on-time slot
            # as missed.
            math.isfinite(sch.grace_seconds) and sch.grace_seconds >= 1,
            f"{key}.grace_seconds",
            "must be a finite number >= 1",
        )
        _require(
            sch.max_attempts is None or sch.max_attempts >= 1,
            f"{key}.max_attempts",
            "must be >= 1",
        )
        _require(
            len(sch.deployment_id) <= 200, f"{key}.deployment_id", "must be at most 200 characters"
        )
