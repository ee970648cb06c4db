"""A rate window's row never goes back to an earlier window (PostgreSQL): a claim whose
clock is older than the stored window (it waited for the limits lock past the window's
end) adds nothing to it and does not reset it, which would let the current window admit
its cap twice. And a claimer that waited past a window's end claims nothing, then retries."""

from __future__ import annotations

import pytest
from factories import StoreHandle, engine_ready, handle

from runq.config.limits import LimitConfig
from runq.limits import LimitRules

pytestmark = pytest.mark.anyio

__all__ = ["engine_ready", "handle"]  # fixtures used by name


async def _row(h: StoreHandle) -> tuple[float, int]:
    (row,) = await h.raw_fetch(
        f"SELECT window_start, used FROM {h.schema}.rate_windows WHERE pattern = 'task/%'"
    )
    return float(row["window_start"]), int(row["used"])


async def test_an_older_window_neither_adds_nor_resets(handle: StoreHandle) -> None:
    if handle.engine != "postgres":
        pytest.skip("SQLite claims under one write lock: no claim runs on an old clock")
    bump = handle.store.statements.rate_windows_bump  # type: ignore[attr-defined]
    db = handle.store._db  # type: ignore[attr-defined]
    await handle.raw_execute(
        f"INSERT INTO {handle.schema}.rate_windows (pattern, window_start, used) "
        "VALUES ('task/%', 8.0, 20)"
    )
    await db.fetch(bump, ["task/%"], [7.0], [5])  # an old clock: no change
    assert await _row(handle) == (8.0, 20)
    await db.fetch(bump, ["task/%"], [8.0], [1])  # the same window: added
    assert await _row(handle) == (8.0, 21)
    await db.fetch(bump, ["task/%"], [9.0], [2])  # a later window: starts over
    assert await _row(handle) == (9.0, 2)


def test_a_clock_past_a_window_end_is_seen() -> None:
    rules = LimitRules.from_limits({"task/*": LimitConfig(rate="20/second")})
    assert rules.crosses_window(7.9, 8.1)
    assert not rules.crosses_window(8.1, 8.9)
