"""Sidecar credentials stay with their origin, and caller-derived header values cannot
fail a run.

The findings: with ``follow_redirects = true`` a configured ``X-Api-Key`` followed a
redirect to another origin (httpx strips only ``Authorization``); a user id such as
``josé`` (a JWT ``sub``) made the request itself fail. Both against real local servers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

import pytest

from runq.errors import Permanent
from runq.sidecar.http_component import build_http_component
from sidecar.sidecar_fakes import make_ctx
from sidecar.sidecar_servers import Reply, ScriptedServer, serve_scripted

pytestmark = pytest.mark.anyio

NAME = "task/render"


@pytest.fixture
def other_origin() -> Iterator[ScriptedServer]:
    """A second server: another port on the same host is another origin."""
    with serve_scripted() as server:
        yield server


def component(server: ScriptedServer, **spec: Any) -> Any:
    return build_http_component(NAME, {"kind": "http", "url": server.url + "/render", **spec})


async def test_redirect_finding_credentials_never_reach_another_origin(
    app_server: ScriptedServer, other_origin: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APP_KEY", "k-123")
    monkeypatch.setenv("APP_AUTH", "Bearer a-456")
    target = other_origin.url + "/collect"
    app_server.route("/render", Reply(status=307, headers=[("location", target)]))
    other_origin.route("/collect", Reply.json({"got": "it"}))
    handler = component(
        app_server,
        follow_redirects=True,
        headers={"X-Api-Key": "env:APP_KEY", "Authorization": "env:APP_AUTH"},
    )
    ctx, _ = make_ctx()

    with pytest.raises(Permanent, match="refused a redirect"):
        await handler(ctx, {"doc": 1})

    assert other_origin.on("/collect") == []
    [request] = app_server.on("/render")
    assert request.headers["x-api-key"] == "k-123"  # the origin itself got them


async def test_redirect_on_the_same_origin_keeps_its_headers(
    app_server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APP_KEY", "k-123")
    app_server.route("/render", Reply(status=308, headers=[("location", "/v2/render")]))
    app_server.route("/v2/render", Reply.json({"ok": True}))
    handler = component(app_server, follow_redirects=True, headers={"X-Api-Key": "env:APP_KEY"})
    ctx, _ = make_ctx()

    assert await handler(ctx, {"doc": 1}) == {"ok": True}
    [moved] = app_server.on("/v2/render")
    assert moved.headers["x-api-key"] == "k-123"


@pytest.mark.parametrize(
    ("user_id", "session_id"),
    [("josé", "séance 1"), ("a\x1bb\r\nX-Evil: 1", "100%"), ("李", "\u2028")],
)
async def test_user_header_finding_non_ascii_ids_are_percent_encoded(
    app_server: ScriptedServer, user_id: str, session_id: str
) -> None:
    app_server.route("/render", Reply.json({"ok": True}))
    ctx, _ = make_ctx(user_id=user_id, session_id=session_id)

    assert await component(app_server)(ctx, {}) == {"ok": True}

    [request] = app_server.on("/render")
    assert request.headers["runq-user-id"].isascii()
    assert unquote(request.headers["runq-user-id"]) == user_id
    assert unquote(request.headers["runq-session-id"]) == session_id
    assert "x-evil" not in request.headers


async def test_plain_ids_are_sent_as_they_are(app_server: ScriptedServer) -> None:
    app_server.route("/render", Reply.json({"ok": True}))
    ctx, _ = make_ctx(user_id="alice@example.com", session_id="s-7")

    await component(app_server)(ctx, {})

    [request] = app_server.on("/render")
    assert request.headers["runq-user-id"] == "alice@example.com"
    assert request.headers["runq-session-id"] == "s-7"
