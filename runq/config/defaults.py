"""Defaults that are not configuration keys but are shared by a service and a command;
like every other default they are written in this package only, and the services read
them through their ``from_config``."""

from __future__ import annotations

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
