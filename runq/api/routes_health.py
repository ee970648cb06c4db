"""``/healthz``, ``/readyz`` and ``/metrics``: unauthenticated, for probes and scrapers.

None of them returns run content: health is a word, metrics carry counts and labels
(status, component type, deployment), never payloads or user ids.
"""

from __future__ import annotations

import logging

from litestar import Response, get
from prometheus_client import CONTENT_TYPE_LATEST

from runq.api.guards import Services
from runq.api.problems import NotReady, error_responses
from runq.api.schemas import HealthOut, ReadyOut

log = logging.getLogger("runq.api")


@get(
    "/healthz",
    summary="Liveness",
    description="The process is alive (no database call).",
    tags=["health"],
    responses=error_responses(),
)
async def healthz() -> HealthOut:
    return HealthOut(status="ok")


@get(
    "/readyz",
    summary="Readiness",
    description=(
        "The database answers, takes writes and its migrations are current; 503 otherwise."
        " `database` names the server written to (the PostgreSQL primary's host:port)."
    ),
    tags=["health"],
    responses=error_responses(503),
)
async def readyz(services: Services) -> ReadyOut:
    try:
        ready, reason = await services.readiness()
    except Exception as e:
        # A probe must answer "not ready", never 500, whatever the check tripped over.
        log.warning("readiness check raised %s", type(e).__name__)
        raise NotReady(f"readiness check failed ({type(e).__name__})") from e
    if not ready:
        raise NotReady(reason)
    store = services.queue.store
    database = store.server if store.engine == "postgres" else store.engine
    return ReadyOut(status="ready", detail=reason, database=database)


@get(
    "/metrics",
    summary="Prometheus metrics",
    media_type="text/plain",
    tags=["health"],
    responses=error_responses(),
)
async def metrics(services: Services) -> Response[bytes]:
    # The exact Prometheus content type, set as a header: Litestar would append a second
    # charset to a text/* media type that already names one.
    body = await services.render_metrics()
    return Response(body, headers={"content-type": CONTENT_TYPE_LATEST})


health_handlers = [healthz, readyz, metrics]
