"""Checks across the whole ``Config`` after decoding; each names the key at fault."""

from __future__ import annotations

import math

import msgspec

from runq.config.budget import _validate_budget
from runq.config.common import _SECRET_REF_RE, _require
from runq.config.components import _validate_components, _validate_routing
from runq.config.http import _validate_http
from runq.config.limits import _validate_limits
from runq.config.privacy import PRIVACY_LEVELS
from runq.config.queue import _validate_queue
from runq.config.root import Config
from runq.config.schedules import _validate_schedules
from runq.config.store import _validate_store


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
