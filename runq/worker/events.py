"""The batching writer of ``ctx.emit``, shared by every execution of a worker.

``emit`` validates and encodes the event, appends it to its execution's buffer and
returns: the handler never waits for the database. One flusher task per worker gathers
what every execution emitted within ``FLUSH_DELAY_SECONDS`` and writes it with one
``append_events_many`` (one transaction for all the runs in the batch, fenced per run), so
many short runs that emit a few events each share statements, and a handler streaming
thousands of deltas costs a few statements a second. ``EventWriter.close`` flushes its
execution's events before the run's outcome is written, so the final lifecycle event is
always the last of the log; a run that completes hands what is left to its completion
instead (``take_rest``), written in the completion's own fenced transaction. A run whose
fence refuses the write belongs to a worker that lost its lease: its buffer is dropped,
nothing more of it is written, and the execution is told (``on_lost``). ``MAX_PENDING``
bounds one execution's buffer: past it ``emit`` waits for the flusher, which keeps a
runaway handler from filling memory.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import anyio

from runq.log import get_logger
from runq.loops import EVENTS_BACKOFF, Retry
from runq.model import Lease, NewEvent
from runq.store.base import Store
from runq.store.events import new_event

log = get_logger("runq.worker.events")

FLUSH_DELAY_SECONDS = 0.002
#: Events in one write, across runs.
MAX_BATCH = 1000
MAX_PENDING = 5000
#: The most unwritten events a completion carries (``EventWriter.take_rest``); a handler
#: that left more behind has them written by the batcher first.
MAX_CARRIED = 1000
#: A write failing for a database outage is retried this often before its events are
#: given up (logged); the runs themselves go on.
WRITE_ATTEMPTS = 5


class EventWriter:
    """The events of one execution (one lease); written by the worker's ``EventBatcher``."""

    def __init__(self, batcher: EventBatcher, lease: Lease, on_lost: Callable[[], None]) -> None:
        self.lease = lease
        self._batcher = batcher
        self._on_lost = on_lost
        self.pending: list[NewEvent] = []
        #: Set whenever nothing of this execution is buffered or being written.
        self.idle = asyncio.Event()
        self.idle.set()
        self.closing = False
        self.lost = False
        #: Whether any event carried data (a settled run then has something to trim).
        self.wrote_data = False
        #: Batches holding events of this execution that are being written now.
        self.writing = 0

    async def emit(self, kind: str, data: Any = None) -> None:
        """Queue one event; raises ``InvalidPayload`` for a bad kind or data at once."""
        event = new_event(kind, data)
        if self.lost or self.closing:
            return
        self.wrote_data = self.wrote_data or event.data is not None
        self.pending.append(event)
        self.idle.clear()
        self._batcher.wake(self)
        while len(self.pending) > MAX_PENDING and not self.lost:
            await self._batcher.written.wait()

    async def close(self) -> None:
        """Write everything emitted so far (before the outcome is written)."""
        self.closing = True
        if not self.idle.is_set():
            # The executions finishing within the same few milliseconds share the write
            # (the outcome waits at most about FLUSH_DELAY_SECONDS for it).
            self._batcher.wake(self)
            await self.idle.wait()

    async def take_rest(self) -> tuple[NewEvent, ...]:
        """Stop writing and hand back what is still unwritten, for the run's completion to
        write in its own fenced transaction (one write instead of two, and the outcome
        does not wait for the batcher). Writes already under way land first, so the
        events keep their order. Empty when the lease was lost meanwhile."""
        if len(self.pending) > MAX_CARRIED:
            await self.close()
            return ()
        self.closing = True
        rest, self.pending = tuple(self.pending), []
        self._batcher.forget(self)
        while self.writing and not self.lost:
            await self._batcher.written.wait()
        return () if self.lost else rest

    def abandon(self) -> None:
        """Drop what is buffered (the execution ends without settling)."""
        self.closing = True
        self.pending.clear()
        self._batcher.forget(self)

    def fenced_off(self) -> None:
        self.lost = True
        self.pending.clear()
        with contextlib.suppress(Exception):
            self._on_lost()


class EventBatcher:
    """One per worker: writes the buffered events of all its executions together."""

    def __init__(self, store: Store, worker_id: str) -> None:
        self._store = store
        self._worker_id = worker_id
        self._waiting: dict[Lease, EventWriter] = {}
        self._task: asyncio.Task[None] | None = None
        #: Pulsed after every write (``emit`` waits on it when a buffer is full).
        self.written = asyncio.Event()

    def writer(self, lease: Lease, on_lost: Callable[[], None]) -> EventWriter:
        return EventWriter(self, lease, on_lost)

    def wake(self, writer: EventWriter) -> None:
        self._waiting[writer.lease] = writer
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._flush_loop())

    def forget(self, writer: EventWriter) -> None:
        if self._waiting.get(writer.lease) is writer:
            del self._waiting[writer.lease]
        writer.idle.set()

    async def _flush_loop(self) -> None:
        while self._waiting:
            # Gather what the other executions emit meanwhile (a few ms at most).
            await anyio.sleep(FLUSH_DELAY_SECONDS)
            batch = self._take_batch()
            if batch:
                await self._write(batch)
            self.written.set()
            self.written = asyncio.Event()

    def _take_batch(self) -> list[tuple[EventWriter, list[NewEvent]]]:
        """Up to ``MAX_BATCH`` events, whole buffers first; writers left empty go idle
        once their events are written."""
        batch: list[tuple[EventWriter, list[NewEvent]]] = []
        room = MAX_BATCH
        for lease, writer in list(self._waiting.items()):
            if room <= 0:
                break
            taken, writer.pending = writer.pending[:room], writer.pending[room:]
            room -= len(taken)
            if not writer.pending:
                del self._waiting[lease]
            if taken:
                writer.writing += 1
                batch.append((writer, taken))
            elif not writer.pending:
                writer.idle.set()
        return batch

    async def _write(self, batch: list[tuple[EventWriter, list[NewEvent]]]) -> None:
        entries = [(writer.lease, events) for writer, events in batch]
        applied: set[str] | None = None
        retry = Retry(EVENTS_BACKOFF, metric=None, event="events.write_failed", log_delay=False)
        for _ in range(WRITE_ATTEMPTS):
            try:
                applied = await self._store.append_events_many(self._worker_id, entries)
                break
            except Exception as e:  # the database is away: retry, then give these up
                await anyio.sleep(retry.failed(e, events=len(entries)))
        for writer, _ in batch:
            writer.writing -= 1
            if applied is not None and writer.lease.run_id not in applied:
                writer.fenced_off()
            if not writer.pending:
                writer.idle.set()
