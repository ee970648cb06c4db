"""The overview's numbers, read from the metrics exporter rather than from the database.

The exporter already derives counts by status, the oldest queued age per deployment,
expired leases and live workers from one database pass that it caches for a few seconds,
so a Prometheus scrape storm never turns into a query storm. The console reads the same
cached values (through the Prometheus text the API serves at ``/metrics``): however many
tabs are open on the overview, and however often they refresh, the database sees no more
queries than the scraper alone causes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from runq.model import Status


@dataclass(frozen=True)
class Overview:
    counts: dict[str, int]
    #: Deployment id ("" = runs for any worker) → seconds the oldest claimable run has waited.
    oldest_queued_age_by_deployment: dict[str, float]
    live_workers: int
    expired_leases: int
    #: Budget refusals counted by *this* replica since it started, by the cap reached.
    budget_refusals_here: dict[str, int] = field(default_factory=dict)
    #: The PostgreSQL primary this replica writes to ("" on SQLite, or before it connected).
    primary: str = ""
    #: Moves to another primary this replica has seen since it started.
    failovers_here: int = 0

    @property
    def dead_letters(self) -> int:
        return self.counts.get(Status.FAILED.value, 0)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_live_data(self) -> dict[str, object]:
        """What the overview's live stream sends: every number the page shows, by name."""
        data: dict[str, object] = {f"count-{k}": v for k, v in self.counts.items()}
        data.update(
            {
                "dead-letters": self.dead_letters,
                "live-workers": self.live_workers,
                "expired-leases": self.expired_leases,
                "total": self.total,
                "primary": self.primary,
                "failovers-here": self.failovers_here,
            }
        )
        return data


def _samples(text: str) -> Iterable[Sample]:
    for family in text_string_to_metric_families(text):
        yield from family.samples


def overview_from_metrics(text: str) -> Overview:
    counts = {status.value: 0 for status in Status}
    ages: dict[str, float] = {}
    live = expired = failovers = 0
    primary = ""
    refusals: dict[str, int] = {}
    for sample in _samples(text):
        name, labels, value = sample.name, sample.labels, sample.value
        if name == "runq_runs" and labels.get("status") in counts:
            counts[labels["status"]] = int(value)
        elif name == "runq_oldest_queued_age_seconds":
            ages[labels.get("deployment_id", "")] = float(value)
        elif name == "runq_live_workers":
            live = int(value)
        elif name == "runq_expired_leases":
            expired = int(value)
        elif name == "runq_budget_refusals_total":
            refusals[labels.get("reason", "")] = int(value)
        elif name == "runq_store_primary_info" and value:
            primary = labels.get("server", "")
        elif name == "runq_store_failovers_total":
            failovers = int(value)
    return Overview(
        counts=counts,
        oldest_queued_age_by_deployment=dict(sorted(ages.items())),
        live_workers=live,
        expired_leases=expired,
        budget_refusals_here=refusals,
        primary=primary,
        failovers_here=failovers,
    )
