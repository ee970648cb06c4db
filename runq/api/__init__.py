"""HTTP: submission, runs, the ``/queue`` operator surface, health, metrics and auth.

The daemon builds ``ApiServices`` and calls ``runq.api.app.create_app(services)``; the app
holds no state of its own beyond what it is given here (docs/INTERNALS.md, "Daemon ↔ API
seam").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Imported for the annotation only: the queue module pulls in the store engines and the
    # worker core, and the API package stays light to import (tests build apps around fakes).
    from runq.config import Config
    from runq.ops.operations import Operations
    from runq.queue import Queue


#: Where create_app keeps the services and the authenticator in ``app.state``.
SERVICES_STATE_KEY = "runq_services"
AUTHENTICATOR_STATE_KEY = "runq_authenticator"


@dataclass(frozen=True)
class ApiServices:
    #: The producer side: submit, cancel, continue, requeue, wait and follow runs.
    queue: Queue
    #: The operator's side: every other read, pauses and schedules.
    ops: Operations
    config: Config
    #: False → every /queue path answers 503 (an API-only replica runs no worker).
    worker_enabled: bool
    #: Prometheus text for GET /metrics.
    render_metrics: Callable[[], Awaitable[bytes]]
    #: GET /readyz: (ready, reason).
    readiness: Callable[[], Awaitable[tuple[bool, str]]]
    #: After a requeue or continue: wake the local claimers now instead of at the next poll.
    wake: Callable[[], None]


__all__ = ["AUTHENTICATOR_STATE_KEY", "SERVICES_STATE_KEY", "ApiServices"]
