"""Fixtures of the sidecar tests: a scripted local HTTP server per test, and real
``runq serve`` daemons (``serve_harness``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from serve_harness import *  # noqa: F403 - runq_setup, serve_factory for the end-to-end tests

from sidecar.sidecar_servers import ScriptedServer, serve_scripted


@pytest.fixture
def app_server() -> Iterator[ScriptedServer]:
    """The application (or provider) runq calls: a real HTTP server on 127.0.0.1."""
    with serve_scripted() as server:
        yield server
