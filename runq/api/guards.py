"""Litestar guards and dependencies: who is asking, and may they use this router.

Guards run before Litestar reads the body or parameters, so an unauthenticated or
refused request is answered without decoding (or buffering) anything it sent.
"""

from __future__ import annotations

from typing import Annotated, Any, cast

from litestar import Request
from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler
from litestar.params import Dependency

from runq.api import AUTHENTICATOR_STATE_KEY, SERVICES_STATE_KEY, ApiServices
from runq.api.auth import Authenticator, Forbidden, Identity
from runq.api.problems import WorkerDisabled
from runq.api.schemas import is_plausible_id
from runq.errors import NotFound
from runq.model import Run

_IDENTITY_STATE_KEY = "runq_identity"

Connection = ASGIConnection[Any, Any, Any, Any]

# Handler parameter types for the two dependencies. ``skip_validation``: Litestar would
# otherwise run these objects through msgspec conversion on every request (and resolve
# ApiServices' annotations, which name the Queue only for type checkers).
Services = Annotated[ApiServices, Dependency(skip_validation=True)]
CurrentIdentity = Annotated[Identity, Dependency(skip_validation=True)]


def services_of(connection: Connection) -> ApiServices:
    return cast(ApiServices, connection.app.state[SERVICES_STATE_KEY])


def require_worker(connection: Connection, _handler: BaseRouteHandler) -> None:
    """``/queue`` on an API-only replica: 503 before anything else.

    The durable queue's operator surface is not enabled there; saying so comes first, so
    the answer is the same whoever asks and no credentials are read for nothing.
    """
    if not services_of(connection).worker_enabled:
        raise WorkerDisabled(
            "this replica runs no worker ([queue] worker = false); /queue is disabled"
        )


def authenticate(connection: Connection, _handler: BaseRouteHandler) -> None:
    authenticator = cast(Authenticator, connection.app.state[AUTHENTICATOR_STATE_KEY])
    identity = authenticator.authenticate(connection.headers.get("authorization"))
    connection.state[_IDENTITY_STATE_KEY] = identity


def require_admin(connection: Connection, _handler: BaseRouteHandler) -> None:
    """The operator surface: a JWT identity needs the admin scope (key and open are admins)."""
    if not identity_of(connection).is_admin:
        raise Forbidden("the /queue operator surface needs the admin scope")


def identity_of(connection: Connection) -> Identity:
    return cast(Identity, connection.state[_IDENTITY_STATE_KEY])


def provide_identity(request: Request[Any, Any, Any]) -> Identity:
    """Dependency ``identity``: set by the ``authenticate`` guard of the router."""
    return identity_of(request)


def provide_services(request: Request[Any, Any, Any]) -> ApiServices:
    """Dependency ``services``."""
    return services_of(request)


async def visible_run(services: ApiServices, identity: Identity, run_id: str) -> Run:
    """The run ``run_id`` names, when the caller may see it; a run they may not see does
    not exist for them (``NotFound``, never ``Forbidden``: its id says nothing)."""
    run = await services.ops.get(run_id) if is_plausible_id(run_id) else None
    if run is None or not identity.can_see(run):
        raise NotFound("no such run")
    return run
