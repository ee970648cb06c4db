"""Handlers the bench registers in ``[components]`` (``bench/`` is put on PYTHONPATH).

``noop`` is the no-op run of W1/W3/W4/mem; ``record_start`` is W2's: it answers the submit
time its producer put in the payload next to the time the handler started, so the
latency is computed from the stored answers after the run. ``noop`` notes its first call
on ``common.PROBE``: the in-process variant times its drain and counts its CPU from there.
"""

from __future__ import annotations

import time
from typing import Any

import common

_hit = common.PROBE.hit


async def noop(ctx: Any, payload: Any) -> None:
    _hit()


async def record_start(ctx: Any, payload: Any) -> dict[str, Any]:
    started = time.time()
    submitted = payload.get("t") if isinstance(payload, dict) else None
    return {"t": submitted, "started": started}
