"""``create_app(services)``: the Litestar application ``runq serve`` hosts on ``[http] listen``.

Request and response bodies are msgspec Structs (``runq.api.schemas``); Litestar validates
them and generates the OpenAPI 3 document, served at ``/schema/openapi.json``.
"""

from __future__ import annotations

from collections.abc import Sequence

from litestar import Litestar
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme
from litestar.types import ControllerRouterHandler

from runq.api import AUTHENTICATOR_STATE_KEY, SERVICES_STATE_KEY, ApiServices
from runq.api.auth import build_authenticator
from runq.api.edge import EdgePolicy, RequestEdge
from runq.api.guards import provide_identity, provide_services
from runq.api.json_body import JsonRequest
from runq.api.problems import handle_exception
from runq.api.routes_batch import batch_router
from runq.api.routes_bulk import bulk_router
from runq.api.routes_events import events_router
from runq.api.routes_health import health_handlers
from runq.api.routes_pauses import pauses_router
from runq.api.routes_queue import queue_router
from runq.api.routes_runs import runs_router
from runq.api.routes_schedules import schedules_router

#: Where the generated OpenAPI document is served: ``/schema/openapi.json``.
OPENAPI_PATH = "/schema"
API_VERSION = "1"


def create_app(
    services: ApiServices, extra_routes: Sequence[ControllerRouterHandler] = ()
) -> Litestar:
    """Build the app. Raises ``ConfigError`` when an auth secret or key cannot be read.

    ``extra_routes`` are mounted beside the API (the daemon adds the console's pages);
    the API itself never imports the console, which sits above it.
    """
    http = services.config.http
    authenticator = build_authenticator(http)
    secured = http.auth != "open"
    return Litestar(
        route_handlers=[
            runs_router(secured=secured),
            batch_router(secured=secured),
            queue_router(secured=secured),
            bulk_router(secured=secured),
            schedules_router(secured=secured),
            pauses_router(secured=secured),
            events_router(secured=secured),
            *health_handlers,
            *extra_routes,
        ],
        dependencies={
            "services": Provide(provide_services, sync_to_thread=False),
            "identity": Provide(provide_identity, sync_to_thread=False),
        },
        state=State({SERVICES_STATE_KEY: services, AUTHENTICATOR_STATE_KEY: authenticator}),
        exception_handlers={Exception: handle_exception},
        # Host, Origin and Content-Type are checked before routing guards or bodies.
        middleware=[RequestEdge(EdgePolicy.from_config(http))],
        request_class=JsonRequest,
        request_max_body_size=http.max_body_bytes,
        openapi_config=_openapi_config(),
        # runq configures logging itself; Litestar must not install handlers of its own.
        logging_config=None,
        debug=False,
    )


def _openapi_config() -> OpenAPIConfig:
    return OpenAPIConfig(
        title="runq",
        version=API_VERSION,
        description="A durable queue for background runs: submission, runs and the /queue "
        "operator surface.",
        path=OPENAPI_PATH,
        render_plugins=[JsonRenderPlugin()],
        components=Components(
            security_schemes={
                "bearer": SecurityScheme(
                    type="http",
                    scheme="bearer",
                    description="[http] auth = key: the API key; auth = jwt: a signed JWT.",
                )
            }
        ),
    )
