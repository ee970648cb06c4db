"""A store stand-in for the unit tests of the services (reaper, retention, heartbeat): it
answers from scripted replies, counts every call and fails on demand, so a test can put a
service through an outage without stopping a database. Only the verbs those services
call exist; the store itself is tested against real databases (tests/store/)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from runq.errors import StoreUnavailable
from runq.model import HeartbeatResult, Lease, ReapReport


class FakeStore:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        #: While set, every verb raises it (the database is away).
        self.failure: BaseException | None = None
        self.reaps: list[ReapReport] = []
        self.purges: list[int] = []
        #: Leases the heartbeat finds lost, and runs whose cancel was requested.
        self.lost: set[tuple[str, int]] = set()
        self.cancel_requested: list[str] = []
        self.trimmed: list[str] = []
        self.fail_trim = False

    def go_away(self, error: BaseException | None = None) -> None:
        self.failure = error or StoreUnavailable("the database is away")

    def come_back(self) -> None:
        self.failure = None

    def _call(self, verb: str) -> None:
        self.calls[verb] += 1
        if self.failure is not None:
            raise self.failure

    async def ping(self) -> None:
        self._call("ping")

    async def reap_stale(self, *, lock_grace_seconds: float, limit: int) -> ReapReport:
        self._call("reap_stale")
        return self.reaps.pop(0) if self.reaps else ReapReport()

    async def trim_events(self, run_id: str, level: str, redacted_max_chars: int) -> None:
        self._call("trim_events")
        if self.fail_trim:
            raise StoreUnavailable("trim failed")
        self.trimmed.append(run_id)

    async def purge_batch(
        self, *, retention_seconds: float, paused_retention_seconds: float, limit: int
    ) -> int:
        self._call("purge_batch")
        return self.purges.pop(0) if self.purges else 0

    async def heartbeat_many(self, worker_id: str, leases: Sequence[Lease]) -> HeartbeatResult:
        self._call("heartbeat_many")
        lost = tuple(le for le in leases if (le.run_id, le.attempt) in self.lost)
        renewed = tuple(le for le in leases if le not in lost)
        cancels = tuple(r for r in self.cancel_requested if any(le.run_id == r for le in renewed))
        return HeartbeatResult(renewed=renewed, lost=lost, cancel_requested=cancels)
