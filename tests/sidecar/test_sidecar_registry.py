"""The built-in kinds through the real configuration path: TOML → ``load_config`` →
``ComponentRegistry.from_config`` → an async handler the executor awaits on its loop."""

from __future__ import annotations

from pathlib import Path

import pytest

from runq.components import ComponentRegistry, is_async_handler
from runq.config import load_config
from runq.errors import ConfigError
from runq.sidecar import close_component
from sidecar.sidecar_fakes import make_ctx
from sidecar.sidecar_servers import Reply, ScriptedServer

pytestmark = pytest.mark.anyio

TOML = """
[components."task/render"]
kind = "http"
url = "{url}/render"
headers = {{ Authorization = "env:RUNQ_TEST_APP_AUTH", Accept = "application/json" }}
poll = {{ enabled = true, interval_seconds = 0.1, max_seconds = 5 }}

[components."agent/summarize"]
kind = "openai-chat"
base_url = "{url}/v1"
model = "m"
api_key = "env:RUNQ_TEST_OPENAI_KEY"
prices = {{ prompt_per_1k = 0.5, completion_per_1k = 1.5 }}
"""


@pytest.fixture(autouse=True)
def secrets_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNQ_TEST_APP_AUTH", "Bearer t")
    monkeypatch.setenv("RUNQ_TEST_OPENAI_KEY", "sk-t")


async def test_tables_become_async_handlers(tmp_path: Path, app_server: ScriptedServer) -> None:
    path = tmp_path / "runq.toml"
    path.write_text(TOML.format(url=app_server.url))
    config = load_config(path, environ={})
    registry = ComponentRegistry.from_config(config.components)

    render = registry.get("task", "render")
    summarize = registry.get("agent", "summarize")
    assert render is not None
    assert summarize is not None
    assert is_async_handler(render)
    assert is_async_handler(summarize)

    app_server.route("/render", Reply.json({"ok": True}))
    ctx, _ = make_ctx()
    assert await render(ctx, {"doc": 1}) == {"ok": True}
    assert app_server.requests[0].headers["authorization"] == "Bearer t"
    await close_component(render)
    await close_component(summarize)


def test_a_bad_table_stops_the_registry_with_its_key(tmp_path: Path) -> None:
    path = tmp_path / "runq.toml"
    path.write_text('[components."task/render"]\nkind = "http"\nurl = "http://x/"\nmethod = 3\n')
    config = load_config(path, environ={})
    with pytest.raises(ConfigError) as info:
        ComponentRegistry.from_config(config.components)
    assert info.value.key == 'components."task/render".method'


def test_an_unknown_kind_is_refused_by_the_configuration(tmp_path: Path) -> None:
    path = tmp_path / "runq.toml"
    path.write_text('[components."task/render"]\nkind = "grpc"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert info.value.key == 'components."task/render".kind'
