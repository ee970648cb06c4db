"""TOML + environment → one frozen ``Config``. Every error names the key.

Order: built-in defaults, then the file (``--config FILE``, else ``RUNQ_CONFIG``), then
``RUNQ_<SECTION>_<KEY>`` variables for known keys (``RUNQ_STORE_URL``,
``RUNQ_HTTP_JWT_SECRET``); other ``RUNQ_*`` variables are ignored. An unknown key in the
file is an error that suggests the nearest known one.
"""

from __future__ import annotations

from runq.config.budget import BUDGET_PERIODS, BUDGET_SCOPES, BudgetConfig, BudgetLimit
from runq.config.components import COMPONENT_KINDS
from runq.config.defaults import (
    LIVE_WORKER_HEARTBEATS,
    REAP_LIMIT,
    SWEEP_LIMIT,
    SWEEP_TIME_LIMIT_SECONDS,
    WORKER_PRUNE_INTERVAL_SECONDS,
    WORKER_ROW_MAX_AGE_SECONDS,
)
from runq.config.http import (
    AUTH_MODES,
    JWT_ALGORITHMS,
    HttpConfig,
    JwtConfig,
    is_loopback,
    split_listen,
)
from runq.config.limits import (
    COMPONENT_PATTERN_RE,
    RATE_PERIODS,
    LimitConfig,
    is_component_pattern,
    parse_rate,
)
from runq.config.loading import load_config, read_toml
from runq.config.privacy import PRIVACY_LEVELS, PrivacyConfig
from runq.config.queue import FLEET_SETTINGS, TRANSPORTS, QueueConfig, ReaperConfig
from runq.config.root import CliConfig, Config, SealConfig
from runq.config.schedules import SCHEDULE_CATCH_UPS, SCHEDULE_OVERLAPS, ScheduleConfig
from runq.config.store import (
    WRITABLE_TARGETS,
    StoreConfig,
    redact_url,
    store_engine,
    target_session_attrs,
)
from runq.config.validation import validate

__all__ = [
    "AUTH_MODES",
    "BUDGET_PERIODS",
    "BUDGET_SCOPES",
    "COMPONENT_KINDS",
    "COMPONENT_PATTERN_RE",
    "FLEET_SETTINGS",
    "JWT_ALGORITHMS",
    "LIVE_WORKER_HEARTBEATS",
    "PRIVACY_LEVELS",
    "RATE_PERIODS",
    "REAP_LIMIT",
    "SCHEDULE_CATCH_UPS",
    "SCHEDULE_OVERLAPS",
    "SWEEP_LIMIT",
    "SWEEP_TIME_LIMIT_SECONDS",
    "TRANSPORTS",
    "WORKER_PRUNE_INTERVAL_SECONDS",
    "WORKER_ROW_MAX_AGE_SECONDS",
    "WRITABLE_TARGETS",
    "BudgetConfig",
    "BudgetLimit",
    "CliConfig",
    "Config",
    "HttpConfig",
    "JwtConfig",
    "LimitConfig",
    "PrivacyConfig",
    "QueueConfig",
    "ReaperConfig",
    "ScheduleConfig",
    "SealConfig",
    "StoreConfig",
    "is_component_pattern",
    "is_loopback",
    "load_config",
    "parse_rate",
    "read_toml",
    "redact_url",
    "split_listen",
    "store_engine",
    "target_session_attrs",
    "validate",
]
