"""The batching writer of one execution's events (``ctx.emit``).

``emit`` validates and encodes the event, appends it to a buffer and returns: the handler
never waits for the database. One flusher task per execution gathers what arrives within
``FLUSH_DELAY_SECONDS`` and writes it with one fenced ``append_events`` (up to
``MAX_BATCH`` events a statement), so a handler streaming thousands of deltas costs a few
statements a second. ``close`` flushes everything before the run's outcome is written, so
the final lifecycle event is always the last of the log. A write the fence refuses means
this worker lost the lease: the buffer is dropped, nothing more is written, and the
execution is told (``on_lost``). ``MAX_PENDING`` bounds the buffer: past it ``emit`` waits
for the flusher, which keeps a runaway handler from filling memory.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import anyio

from runq.backoff import backoff_delay
from runq.log import get_logger
from runq.model import Lease, NewEvent
from runq.store.base import Store
from runq.store.events import new_event

log = get_logger("runq.worker.events")

FLUSH_DELAY_SECONDS = 0.002
MAX_BATCH = 500
MAX_PENDING = 5000
#: A write failing for a database outage is retried this often before its events are
#: given up (logged); the run itself goes on.
WRITE_ATTEMPTS = 5


class EventWriter:
    """The events of one execution (one lease), written in batches behind the handler."""

    def __init__(
        self, store: Store, worker_id: str, lease: Lease, on_lost: Callable[[], None]
    ) -> None:
        self._store = store
        self._worker_id = worker_id
        self._lease = lease
        self._on_lost = on_lost
        self._pending: list[NewEvent] = []
        self._wakeup = asyncio.Event()
        self._drained = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.lost = False
        #: Whether any event carried data (a settled run then has something to trim).
        self.wrote_data = False

    async def emit(self, kind: str, data: Any = None) -> None:
        """Queue one event; raises ``InvalidPayload`` for a bad kind or data at once."""
        event = new_event(kind, data)
        if self.lost or self._closing:
            return
        self.wrote_data = self.wrote_data or event.data is not None
        self._pending.append(event)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._flush_loop())
        self._wakeup.set()
        while len(self._pending) > MAX_PENDING and not self.lost:
            self._drained.clear()
            await self._drained.wait()

    async def close(self) -> None:
        """Write everything emitted so far and stop (before the outcome is written)."""
        self._closing = True
        task, self._task = self._task, None
        if task is None:
            return
        self._wakeup.set()
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            task.cancel()
            raise

    def abandon(self) -> None:
        """Drop what is buffered (the execution ends without settling)."""
        self._pending.clear()
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _flush_loop(self) -> None:
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if not self._closing:
                await asyncio.sleep(FLUSH_DELAY_SECONDS)
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            written = await self._write(batch)
            self._drained.set()
            if not written:
                self._pending.clear()
                if self.lost:
                    return

    async def _write(self, batch: list[NewEvent]) -> bool:
        for failures in range(1, WRITE_ATTEMPTS + 1):
            try:
                applied = await self._store.append_events(self._worker_id, self._lease, batch)
            except Exception as e:  # the database is away: retry, then give these up
                log.warning(
                    "events.write_failed",
                    run_id=self._lease.run_id,
                    events=len(batch),
                    error=str(e),
                )
                await anyio.sleep(backoff_delay(failures, cap=2.0, base=0.05))
                continue
            if not applied:
                self.lost = True
                with contextlib.suppress(Exception):
                    self._on_lost()
            return applied
        return False
