"""The ``local`` transport: an in-process wake-up for claimers of a daemon in this process.

A hub per database (store URL + schema) holds the callbacks of the claimers and executors
running in this process; a ``Queue`` on the same database calls them. A process with no
daemon has no subscribers, and a wake-up is a no-op (the daemons' polls cover the row).
"""

from __future__ import annotations

from collections.abc import Callable

from runq.log import get_logger

log = get_logger(__name__)


class LocalHub:
    def __init__(self) -> None:
        self._wakers: list[Callable[[], None]] = []
        self._cancellers: list[Callable[[str], None]] = []

    def subscribe(
        self, wake: Callable[[], None], cancel: Callable[[str], None]
    ) -> Callable[[], None]:
        """Register a daemon's callbacks; returns the function that unregisters them."""
        self._wakers.append(wake)
        self._cancellers.append(cancel)

        def unsubscribe() -> None:
            self._wakers.remove(wake)
            self._cancellers.remove(cancel)

        return unsubscribe

    def wake(self) -> None:
        for waker in list(self._wakers):
            waker()

    def cancel(self, run_id: str) -> None:
        for canceller in list(self._cancellers):
            canceller(run_id)


_hubs: dict[str, LocalHub] = {}


def hub_for(store_url: str, schema: str) -> LocalHub:
    key = f"{store_url}#{schema}"
    hub = _hubs.get(key)
    if hub is None:
        hub = _hubs[key] = LocalHub()
    return hub
