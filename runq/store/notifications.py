"""How a process hears about runs: wake-ups, cancels and event messages, one object per store.

A store owns every conversation with its database, the notifications included
(``Store.notifications()``): on PostgreSQL the ``LISTEN`` connection beside the pool and
``NOTIFY`` through it (``runq.store.postgres.notifications``); on SQLite, whose file has no
channel between processes, this in-process delivery alone, while readers fall back to
polling the file. The transports above only decide *when* to send (routing, coalescing).

Three kinds of message travel the installation's channel, all plain text:

- ``wake``: a run is waiting; the claimers subscribed here run a claim pass;
- ``cancel:<run id>``: the executor holding that run interrupts it;
- ``event:<run id>:<seq>``: the run wrote an event; its followers read on (``EventFeed``).

Whatever arrives, from this process or from the channel, goes through ``deliver``, so a
claimer, the console and a follower never care where a message came from.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

import anyio
from anyio.abc import TaskStatus

#: The message that wakes claimers, and the prefixes of a cancel and of an event message.
WAKE_MESSAGE = "wake"
CANCEL_PREFIX = "cancel:"
EVENT_PREFIX = "event:"

#: Between a follower's fetches when no notification can arrive (nothing listens here).
FAST_POLL_SECONDS = 0.05
#: Between fetches while a listener is connected (a safety net under the notifications).
LISTENING_POLL_SECONDS = 0.5


class MessageKind(Enum):
    WAKE = "wake"
    CANCEL = "cancel"
    EVENT = "event"
    UNKNOWN = "unknown"


def parse_message(payload: str) -> tuple[MessageKind, str | None]:
    """The kind of a channel message and the run id it names (None for ``wake``)."""
    if payload == WAKE_MESSAGE:
        return MessageKind.WAKE, None
    if payload.startswith(CANCEL_PREFIX) and len(payload) > len(CANCEL_PREFIX):
        return MessageKind.CANCEL, payload[len(CANCEL_PREFIX) :]
    if payload.startswith(EVENT_PREFIX):
        run_id, _, _seq = payload[len(EVENT_PREFIX) :].rpartition(":")
        if run_id:
            return MessageKind.EVENT, run_id
    return MessageKind.UNKNOWN, None


def cancel_message(run_id: str) -> str:
    return CANCEL_PREFIX + run_id


class _Waiters:
    """The readers of one run waiting on the feed, and the event that wakes them all."""

    __slots__ = ("count", "event")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.count = 0


class EventFeed:
    """Wakes the readers of a run when a message names it. However many clients follow
    one run, the feed holds one waiter event per run."""

    def __init__(self, listening: Callable[[], bool] = lambda: False) -> None:
        self._waiting: dict[str, _Waiters] = {}
        self._listening = listening
        self._watchers: list[Callable[[str], None]] = []

    @property
    def poll_seconds(self) -> float:
        """How long a reader may wait between fetches: long only while a listener is
        connected in this process (a message will come); short otherwise."""
        return LISTENING_POLL_SECONDS if self._listening() else FAST_POLL_SECONDS

    def watch_all(self, callback: Callable[[str], None]) -> None:
        """Also call ``callback(run_id)`` for every run a message names, waiters or not
        (the console's live runs table: any run may be on a page)."""
        self._watchers.append(callback)

    def notify(self, run_id: str) -> None:
        for watcher in self._watchers:
            watcher(run_id)
        waiters = self._waiting.pop(run_id, None)
        if waiters is not None:
            waiters.event.set()

    async def changed(self, run_id: str, timeout: float) -> None:  # noqa: ASYNC109
        """Return when the run may have changed, or after ``timeout`` seconds."""
        waiters = self._waiting.get(run_id)
        if waiters is None:
            waiters = self._waiting[run_id] = _Waiters()
        waiters.count += 1
        try:
            with anyio.move_on_after(timeout):
                await waiters.event.wait()
        finally:
            waiters.count -= 1
            if waiters.count == 0 and self._waiting.get(run_id) is waiters:
                del self._waiting[run_id]


class Notifications:
    """The notifications of one store in this process; this base delivers in-process only
    (SQLite, and PostgreSQL's in-process half).

    ``subscribe`` registers a daemon's claimer and executor callbacks; ``deliver`` routes one
    message to them or to the event feed; ``send`` is how a message leaves: here it is
    delivered in this process at once, on PostgreSQL it is a ``NOTIFY`` every replica hears.
    """

    #: True where ``send`` reaches other processes (PostgreSQL's channel).
    crosses_processes = False

    def __init__(self) -> None:
        self._wakers: list[Callable[[], None]] = []
        self._cancellers: list[Callable[[str], None]] = []
        self.events = EventFeed(lambda: self.listening)

    # -- in this process -----------------------------------------------------------------

    def subscribe(
        self, wake: Callable[[], None], cancel: Callable[[str], None]
    ) -> Callable[[], None]:
        """Register callbacks for wake-ups and cancels; returns the function that
        unregisters them."""
        self._wakers.append(wake)
        self._cancellers.append(cancel)

        def unsubscribe() -> None:
            self._wakers.remove(wake)
            self._cancellers.remove(cancel)

        return unsubscribe

    def wake_here(self) -> None:
        """Wake the claimers subscribed in this process (the ``local`` transport)."""
        for waker in list(self._wakers):
            waker()

    def cancel_here(self, run_id: str) -> None:
        for canceller in list(self._cancellers):
            canceller(run_id)

    def deliver(self, payload: str) -> None:
        """One message, from this process or from the channel, to whoever it concerns."""
        kind, run_id = parse_message(payload)
        if kind is MessageKind.WAKE:
            self.wake_here()
        elif kind is MessageKind.CANCEL and run_id is not None:
            self.cancel_here(run_id)
        elif kind is MessageKind.EVENT and run_id is not None:
            self.events.notify(run_id)

    # -- across processes ------------------------------------------------------------------

    async def send(self, payload: str) -> None:
        """Send one message to every process of the installation (here: this one)."""
        self.deliver(payload)

    @property
    def listening(self) -> bool:
        """True while messages of other processes reach this one."""
        return False

    async def listen(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Hear the other processes until cancelled (a daemon runs it in its task group).
        Nothing to hear here: reports started and returns."""
        task_status.started()
