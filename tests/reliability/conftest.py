"""Fixtures of the reliability tests, and the gate of their ``long`` variants.

A test marked ``@pytest.mark.long`` runs for minutes (the soak and chaos variants). It is
skipped unless it was asked for: ``pytest -m long`` (any ``-m`` expression that names
``long`` hands the choice to pytest's own selection) or ``RUNQ_LONG=1`` in the environment.
The default variants of the same tests stay short, so the default suite stays fast.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from serve_harness import *  # noqa: F403 - runq_setup, serve_factory, pg_setup, ...

HERE = Path(__file__).resolve().parent


def long_runs_requested(config: pytest.Config) -> bool:
    if os.environ.get("RUNQ_LONG", "").lower() in ("1", "true", "yes"):
        return True
    return "long" in (config.getoption("markexpr", "") or "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if long_runs_requested(config):
        return
    skip = pytest.mark.skip(reason="a long variant: run with `pytest -m long` or RUNQ_LONG=1")
    for item in items:
        if item.get_closest_marker("long") is not None and HERE in item.path.parents:
            item.add_marker(skip)
