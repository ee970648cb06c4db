"""``[privacy]``: how much of a run's data is kept."""

from __future__ import annotations

import msgspec

PRIVACY_LEVELS = ("none", "metadata", "redacted", "full")


class PrivacyConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    level: str = "metadata"
    redacted_max_chars: int = 4000
    #: A run continued after a pause (an approval) keeps its answer only when true: the
    #: approver's decision often unlocks data the submitter alone should not see stored.
    keep_answer_after_approval: bool = False
