"""The ``sync`` transport: the dispatch *is* the execution.

``enqueue()`` claims the run by id and executes it in the caller's process with the same
``Executor`` the daemon uses, under its own lease and heartbeat; ``defer()`` on this route
sends nothing, and the next sweep (``runq work`` or a daemon's claimers) finds the row. A
retry of a run on this route is never executed inside the failure handling of the attempt
before it: it stays queued for the next sweep.
"""

from __future__ import annotations

from runq.metrics import CLAIMS
from runq.model import Run
from runq.store.base import Store
from runq.worker.runtime import WorkerRuntime


async def dispatch_in_caller(
    store: Store, runtime: WorkerRuntime, run: Run, *, deployment_id: str | None, serialize: bool
) -> Run | None:
    """Claim ``run`` by id and execute it here. None when it could not be claimed (delayed,
    held back by its session or pinned to another deployment, or already taken): it stays
    queued for a sweep. Raises when the claim or the execution machinery fails."""
    claimed = await store.claim(
        runtime.worker_id,
        1,
        deployment_id=deployment_id,
        serialize_sessions=serialize,
        run_id=run.id,
    )
    if not claimed:
        return None
    CLAIMS.inc()
    await runtime.executor.execute(claimed[0])
    return claimed[0]
