"""The one frozen ``Config``: every section, with its defaults."""

from __future__ import annotations

from typing import Any

import msgspec

from runq.config.budget import BudgetConfig
from runq.config.http import HttpConfig
from runq.config.limits import LimitConfig
from runq.config.privacy import PrivacyConfig
from runq.config.queue import QueueConfig, ReaperConfig
from runq.config.schedules import ScheduleConfig
from runq.config.store import StoreConfig


class SealConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    keys: tuple[str, ...] = ()


class CliConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    service_account: str = "cli"


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
