"""The console's pure parts: the runs query, paging links, the overview from metrics text."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from runq.errors import BadRequest
from runq.model import Page, Status
from runq.ui.listing import DEFAULT_PAGE_SIZE, RunQuery, page_links, parse_query
from runq.ui.overview import overview_from_metrics
from runq.ui.pages import _safe_next, parse_decision
from runq.ui.render import duration


def q(admin: bool = True, **params: str | list[str]) -> RunQuery:
    return parse_query(
        {k: v if isinstance(v, list) else [v] for k, v in params.items()}, admin=admin
    )


def test_query_defaults_and_round_trip() -> None:
    query = q()
    assert (query.sort_by, query.sort_order, query.page, query.limit) == (
        "created_at",
        "desc",
        1,
        DEFAULT_PAGE_SIZE,
    )
    assert query.params() == ""
    query = q(status=["failed", "cancelled", "failed"], user="alice", sort="priority", page="3")
    assert query.statuses == (Status.FAILED, Status.CANCELLED)
    assert query.params() == "status=failed&status=cancelled&user=alice&sort=priority&page=3"
    assert q(**_split(query.params())) == query


def _split(qs: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for pair in qs.split("&"):
        key, _, value = pair.partition("=")
        out.setdefault(key, []).append(value)
    return out


def test_a_user_filter_is_ignored_for_non_admins() -> None:
    assert q(admin=False, user="bob").user is None


@pytest.mark.parametrize(
    "params",
    [
        {"status": "bogus"},
        {"sort": "payload"},
        {"sort": "created_at desc; drop table runs"},
        {"order": "up"},
        {"page": "0"},
        {"page": "-1"},
        {"page": "1e3"},
        {"limit": "201"},
        {"user": "a\x00b"},
        {"user": "x" * 201},
        {"page": ["1", "2"]},
    ],
)
def test_bad_parameters_are_refused(params: dict[str, str | list[str]]) -> None:
    with pytest.raises(BadRequest):
        q(**params)


def test_pending_filters_are_reported_not_applied() -> None:
    query = q(component="task/echo", session=" ", deployment="eu")
    assert query.pending == {"component": "task/echo", "deployment": "eu"}


def test_sort_link_flips_the_order_of_the_current_column() -> None:
    query = q(sort="priority")
    assert "order=asc" in query.sort_link("priority")
    assert query.aria_sort("priority") == "descending"
    assert query.aria_sort("status") == "none"
    assert "order" not in q(sort="priority", order="asc").sort_link("priority")


def test_page_links() -> None:
    page = Page(data=[], page=2, limit=50, total_count=120)
    links = page_links(q(page="2"), page, "/ui/queue/jobs")
    assert links.first == "/ui/queue/jobs"
    assert links.previous == "/ui/queue/jobs"
    assert links.next == "/ui/queue/jobs?page=3"
    assert links.last == "/ui/queue/jobs?page=3"
    past_the_end = page_links(q(page="9"), page, "/ui/queue/jobs")
    assert past_the_end.previous == "/ui/queue/jobs?page=3"
    assert past_the_end.next is None


def test_overview_from_exporter_text() -> None:
    registry = CollectorRegistry()
    runs = Gauge("runq_runs", "", ["status"], registry=registry)
    runs.labels(status="failed").set(7)
    runs.labels(status="queued").set(3)
    ages = Gauge("runq_oldest_queued_age_seconds", "", ["deployment_id"], registry=registry)
    ages.labels(deployment_id="").set(12.5)
    ages.labels(deployment_id="eu").set(400)
    Gauge("runq_live_workers", "", registry=registry).set(2)
    Gauge("runq_expired_leases", "", registry=registry).set(1)
    refusals = Counter("runq_budget_refusals", "", ["reason"], registry=registry)
    refusals.labels(reason="cost").inc(4)
    overview = overview_from_metrics(generate_latest(registry).decode())
    assert overview.counts["failed"] == overview.dead_letters == 7
    assert overview.counts["completed"] == 0
    assert overview.total == 10
    assert overview.oldest_queued_age_by_deployment == {"": 12.5, "eu": 400.0}
    assert (overview.live_workers, overview.expired_leases) == (2, 1)
    assert overview.budget_refusals_here == {"cost": 4}
    assert overview.as_live_data()["dead-letters"] == 7


def test_decisions_and_redirect_targets() -> None:
    assert parse_decision("") is None
    assert parse_decision(' {"ok": true} ') == {"ok": True}
    with pytest.raises(BadRequest, match="not valid JSON"):
        parse_decision("{ok}")
    assert _safe_next("/ui/runs/1?x=2") == "/ui/runs/1?x=2"
    for hostile in ("//evil.example", "https://evil.example/ui", "/ui\\@evil", None, "/queue"):
        assert _safe_next(hostile) == "/ui"


def test_durations() -> None:
    assert [duration(s) for s in (None, 5.9, 65, 7300, 200000)] == [
        "—",
        "5 s",
        "1 min 5 s",
        "2 h 1 min",
        "2 d 7 h",
    ]
