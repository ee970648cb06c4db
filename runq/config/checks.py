"""What every section's validation shares."""

from __future__ import annotations

import re

from runq.errors import ConfigError

SECRET_REF_RE = re.compile(r"^(env:[A-Za-z_]\w*|file:.+)$")


def require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(key, message)
