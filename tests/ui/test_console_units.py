"""The console's pure parts: the runs query, paging links, the overview from metrics text."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import parse_qs

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from runq.errors import BadRequest
from runq.listing import Page, RunCursor
from runq.model import Status
from runq.ui.listing import DEFAULT_PAGE_SIZE, RunQuery, RunsView, page_links, parse_query
from runq.ui.overview import overview_from_metrics
from runq.ui.pages import _safe_next, parse_decision
from runq.ui.render import duration


def q(admin: bool = True, owner: str | None = None, **params: str | list[str]) -> RunQuery:
    return parse_query(
        {k: v if isinstance(v, list) else [v] for k, v in params.items()}, admin=admin, owner=owner
    )


CURSOR = RunCursor(1_700_000_000.25, "01abc").encode()


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
    return parse_qs(qs, keep_blank_values=True)


def test_admin_filters_are_ignored_for_non_admins_and_the_owner_always_applies() -> None:
    query = q(admin=False, owner="alice", user="bob", deployment="eu")
    assert (query.user, query.deployment) == (None, None)
    assert (query.where.user_id, query.where.deployment_id) == (None, None)
    assert query.where.owner == "alice"


def test_filters_reach_the_store_filter_and_round_trip() -> None:
    query = q(
        status="failed",
        component="task/*",
        session="s-1",
        user="alice",
        deployment="eu",
        created_after="2026-11-30T10:15",
        created_before="1764500000.5",
    )
    where = query.where
    assert where.statuses == (Status.FAILED,)
    assert (where.component, where.session_id) == ("task/*", "s-1")
    assert (where.user_id, where.deployment_id, where.owner) == ("alice", "eu", None)
    # The form's date-time inputs have no zone: UTC, as every time the console shows.
    assert where.created_after == datetime(2026, 11, 30, 10, 15, tzinfo=UTC).timestamp()
    assert query.created_after == "2026-11-30T10:15:00"
    assert where.created_before == 1764500000.5
    assert query.created_before == "2025-11-30T10:53:20.500000"
    again = q(**_split(query.params()))
    assert again == query
    assert again.where == where


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
        {"component": "echo"},
        {"component": "Task/echo"},
        {"session": "a\x01b"},
        {"created_after": "yesterday"},
        {"created_before": "nan"},
        {"created_after": "1e300"},
        {"cursor": "not-a-cursor"},
        {"cursor": CURSOR, "before": CURSOR},
        {"cursor": CURSOR, "sort": "priority"},
        {"before": CURSOR, "page": "2"},
    ],
)
def test_bad_parameters_are_refused(params: dict[str, str | list[str]]) -> None:
    with pytest.raises(BadRequest):
        q(**params)


def test_blank_filters_are_no_filters() -> None:
    query = q(component=" ", session="", created_after="")
    assert query.where == q().where
    assert query.params() == ""


def test_sort_link_flips_the_order_of_the_current_column() -> None:
    query = q(sort="priority")
    assert "order=asc" in query.sort_link("priority")
    assert query.aria_sort("priority") == "descending"
    assert query.aria_sort("status") == "none"
    assert "order" not in q(sort="priority", order="asc").sort_link("priority")
    # A new sort starts from the first page: a cursor belongs to the created_at order.
    assert "cursor" not in q(cursor=CURSOR).sort_link("priority")


def test_numbered_page_links_for_other_sorts() -> None:
    page = RunsView(Page(data=[], page=2, limit=50, total_count=120))
    links = page_links(q(page="2", sort="priority"), page, "/ui/queue/jobs")
    assert links.first == "/ui/queue/jobs?sort=priority"
    assert links.previous == "/ui/queue/jobs?sort=priority"
    assert links.next == "/ui/queue/jobs?sort=priority&page=3"
    assert links.last == "/ui/queue/jobs?sort=priority&page=3"
    past_the_end = page_links(q(page="9", sort="priority"), page, "/ui/queue/jobs")
    assert past_the_end.previous == "/ui/queue/jobs?sort=priority&page=3"
    assert past_the_end.next is None


def test_cursor_page_links_by_creation_time() -> None:
    empty = Page(data=[], page=1, limit=50, total_count=120)
    first = page_links(q(status="failed"), RunsView(empty, None, CURSOR), "/b")
    assert (first.first, first.previous, first.last) == (None, None, None)
    assert first.next == f"/b?status=failed&cursor={CURSOR}"
    later = page_links(q(cursor=CURSOR), RunsView(empty, "prev", None), "/b")
    assert (later.first, later.previous, later.next) == ("/b", "/b?before=prev", None)


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
    assert (overview.primary, overview.failovers_here) == ("", 0)  # SQLite: no primary


def test_the_overview_names_the_primary_and_the_failovers_seen() -> None:
    registry = CollectorRegistry()
    primary = Gauge("runq_store_primary_info", "", ["server"], registry=registry)
    primary.labels(server="10.0.0.6:5432").set(1)
    Counter("runq_store_failovers", "", registry=registry).inc()
    overview = overview_from_metrics(generate_latest(registry).decode())
    assert (overview.primary, overview.failovers_here) == ("10.0.0.6:5432", 1)
    live = overview.as_live_data()
    assert (live["primary"], live["failovers-here"]) == ("10.0.0.6:5432", 1)


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
