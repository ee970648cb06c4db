"""Handlers the bench registers in ``[components]`` (``bench/`` is put on PYTHONPATH).

``noop`` is the no-op run of W1/W3/W4/mem; ``record_start`` is W2's: it answers the submit
time its producer put in the payload next to the time the handler started, so the
latency is computed from the stored answers after the run.
"""

from __future__ import annotations

import time
from typing import Any


async def noop(ctx: Any, payload: Any) -> None:
    return None


async def record_start(ctx: Any, payload: Any) -> dict[str, Any]:
    started = time.time()
    submitted = payload.get("t") if isinstance(payload, dict) else None
    return {"t": submitted, "started": started}
