"""``[privacy]``: how much of a run's data is kept."""

from __future__ import annotations

import msgspec

PRIVACY_LEVELS = ("none", "metadata", "redacted", "full")


class PrivacyConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    level: str = "metadata"
    redacted_max_chars: int = 4000
