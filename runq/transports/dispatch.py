"""After a run is written, who must hear of it: the wake-up (or cancel) of its route.

- ``sync``: nobody; the caller executes the run itself (``Queue.enqueue``) or the next
  sweep finds the row (``Queue.defer``).
- ``local``: the claimers subscribed to the store's notifications in this process.
- ``postgres``: those, and every replica through the store's channel, coalesced by the
  ``Notifier`` (or carried by the submit statement itself: ``take_inline_slot``).

A cancel of a running run goes to this process's executors and over the channel at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from runq.log import get_logger
from runq.model import NewRun, Run
from runq.store.notifications import Notifications
from runq.transports.notifier import Notifier
from runq.transports.routing import Router

log = get_logger(__name__)


class Dispatcher:
    """The wake-ups of one queue: routing, in-process delivery and the coalesced channel."""

    def __init__(self, routing: Mapping[str, str], notifications: Notifications) -> None:
        self.router = Router(routing)
        self.notifications = notifications
        #: Coalesces the channel's wake-ups where one reaches other processes; ``run`` it.
        self.notifier = Notifier(notifications) if notifications.crosses_processes else None

    def route(self, component_type: str, component_id: str) -> str:
        """The transport of a component: ``sync``, ``local`` or ``postgres``."""
        return self.router.route(component_type, component_id)

    async def run(self) -> None:
        """Send the coalesced wake-ups until cancelled (nothing to send without a channel)."""
        if self.notifier is not None:
            await self.notifier.run()

    async def flush(self) -> None:
        """Send a pending wake-up now (on close, so the last submissions are announced)."""
        if self.notifier is not None:
            await self.notifier.flush()

    # -- submissions -----------------------------------------------------------------------

    def take_inline_slot(self, new: NewRun) -> bool:
        """True when this submission should carry its ``NOTIFY`` in the submit statement
        (``postgres`` route, and the notifier gives it the slot: ``take_inline_slot``); the
        caller then calls ``inline_done`` once the statement finished."""
        if self.notifier is None:
            return False
        if self.route(new.component_type, new.component_id) != "postgres":
            return False
        return self.notifier.take_inline_slot()

    def inline_done(self) -> None:
        if self.notifier is not None:
            self.notifier.inline_done()

    def woke_inline(self) -> None:
        """The submit statement carried the channel's wake-up: only this process is left."""
        self.notifications.wake_here()

    async def wake(self, run: Run, *, strict: bool) -> None:
        """The wake-up of a stored run's route. ``strict`` (enqueue) raises on failure;
        otherwise (defer, requeue, continue) a failure is logged and the row stays queued."""
        route = self.route(run.component_type, run.component_id)
        if route == "sync":
            return
        self.notifications.wake_here()
        if route != "postgres" or self.notifier is None:
            return
        if not strict:
            self.notifier.request_wake()
            return
        await self.notifier.wake_now()

    def wake_batch(self, runs: Sequence[Run]) -> None:
        """One wake-up for runs stored together: this process once, the channel once when
        any of them is routed there (a failure is logged; the rows stay)."""
        components = {(run.component_type, run.component_id) for run in runs}
        routes = {self.route(*component) for component in components}
        routes.discard("sync")
        if not routes:
            return
        self.notifications.wake_here()
        if "postgres" in routes and self.notifier is not None:
            self.notifier.request_wake()

    def wake_everywhere(self) -> None:
        """Runs of any route may be waiting (the reaper requeued some): this process now,
        the other replicas through the channel."""
        self.notifications.wake_here()
        if self.notifier is not None:
            self.notifier.request_wake()

    # -- cancels ---------------------------------------------------------------------------

    async def cancel(self, run_id: str) -> None:
        """Interrupt a running run wherever it executes: here at once, elsewhere over the
        channel. A failed send is logged: the executor's heartbeat still sees the cancel."""
        self.notifications.cancel_here(run_id)
        if self.notifier is None:
            return
        try:
            await self.notifier.cancel(run_id)
        except Exception as e:
            log.warning("cancel.notify_failed", run_id=run_id, error=str(e))
