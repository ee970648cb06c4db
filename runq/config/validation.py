"""Checks across the whole ``Config`` after decoding; each names the key at fault."""

from __future__ import annotations

import math

import msgspec

from runq.config.budget import validate_budget
from runq.config.checks import SECRET_REF_RE, require
from runq.config.components import validate_components, validate_routing
from runq.config.http import validate_http
from runq.config.limits import validate_limits
from runq.config.privacy import PRIVACY_LEVELS
from runq.config.queue import validate_queue
from runq.config.root import Config
from runq.config.schedules import validate_schedules
from runq.config.store import validate_store


def validate(config: Config) -> None:
    _validate_finite(config)
    validate_store(config.store)
    validate_queue(config.queue)
    q = config.reaper
    require(1 <= q.limit <= 10_000, "reaper.limit", f"{q.limit} must be between 1 and 10000")
    validate_http(config.http)
    for i, ref in enumerate(config.seal.keys):
        require(
            bool(SECRET_REF_RE.match(ref)),
            f"seal.keys[{i}]",
            f"{ref!r} must be 'env:NAME' or 'file:/path'",
        )
    require(bool(config.cli.service_account.strip()), "cli.service_account", "must not be empty")
    validate_budget(config.budget)
    p = config.privacy
    require(
        p.level in PRIVACY_LEVELS,
        "privacy.level",
        f"{p.level!r} is not one of {', '.join(PRIVACY_LEVELS)}",
    )
    require(p.redacted_max_chars >= 16, "privacy.redacted_max_chars", "must be at least 16")
    validate_routing(config)
    validate_components(config.components)
    validate_schedules(config.schedules)
    validate_limits(config.limits)


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
                require(math.isfinite(value), f"{prefix}.{f.name}", "must be a finite number")
