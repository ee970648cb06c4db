"""Batched completions: the results of many runs in one fenced ``complete_many``.

Executions hand their completion in and go: the claimer's runs with ``hand_in`` and a
callback (no task waits for the write), callers that need the answer (``runq work``, the
``sync`` transport, tests) with ``complete``. While ``run()`` is active, completions are
collected for up to ``max_wait`` (5 ms) or ``max_batch`` (64) items, whichever comes first,
and written in one statement: one round trip and one commit for many runs is what lets fast
handlers drain a queue at database speed. Two batches (``writers``) may be in flight at
once, so one batch's WAL flush does not hold up the next. A batch is written at once when
no handler is still executing: nothing else can join it soon, and waiting would only delay
the write (with 16 slots and fast handlers the 5 ms wait paced the drain). Without ``run()``, each
completion is written on its own at once.

A batch that fails because the database is away is written again with backoff (the
completions stay in flight, so their leases are renewed once the database answers): a
completion that happened during an outage is kept, not turned into a retry. Each item's
callback learns whether it was applied (False: fenced off, the lease was lost) or the
error that decided it (a non-transient error, or the completer stopping).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import anyio

from runq.config import Config
from runq.log import get_logger
from runq.loops import UNAVAILABLE_ERRORS, WRITE_BACKOFF, Retry
from runq.metrics import STORE_ERRORS
from runq.model import Completion
from runq.store.base import Store

log = get_logger(__name__)

WRITE_TIMEOUT_SECONDS = 30.0
#: Tuning, not configuration: the most completions one statement writes, and how long the
#: first completion of a batch waits for others.
MAX_BATCH = 64
MAX_WAIT_SECONDS = 0.005
#: Batches written at once: a batch waits for its commit's WAL flush, and a second batch
#: written meanwhile shares the next flush (PostgreSQL's group commit) instead of queueing.
WRITERS = 2
#: What a completion's callback receives: applied (True), fenced off (False), or the error
#: that decided it.
WriteResult = bool | BaseException
OnWritten = Callable[[WriteResult], None]


@dataclass(frozen=True)
class CompleterConfig:
    #: The most completions one statement writes.
    max_batch: int
    #: How long the first completion of a batch waits for others.
    max_wait_seconds: float
    #: Batches written at once.
    writers: int = WRITERS

    @property
    def max_pending(self) -> int:
        """Completions that may be handed in and not yet written: every writer's batch."""
        return self.max_batch * self.writers

    @classmethod
    def from_config(cls, config: Config) -> CompleterConfig:
        """No ``[queue]`` key tunes batching; the parameter keeps one shape for every service."""
        del config
        return cls(max_batch=MAX_BATCH, max_wait_seconds=MAX_WAIT_SECONDS)


@dataclass(slots=True)
class _Item:
    completion: Completion
    on_written: OnWritten
    #: Written again while the database is away (hand-ins); a waiting caller retries itself.
    retry: bool


class Completer:
    def __init__(
        self,
        store: Store,
        worker_id: str,
        config: CompleterConfig,
        *,
        executing: Callable[[], int] | None = None,
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.config = config
        #: How many handlers still execute; none left means nothing more is coming.
        self._executing = executing
        self._pending: list[_Item] = []
        self._has_items = anyio.Event()
        self._full = anyio.Event()
        self._running = False
        #: The backoff before a batch that failed for an outage is written again.
        self._retry = Retry(WRITE_BACKOFF, metric=None, event="complete.retrying", log_delay=False)

    @property
    def running(self) -> bool:
        """Batching: ``hand_in`` may be used (the caller need not wait for the write)."""
        return self._running

    def hand_in(self, completion: Completion, on_written: OnWritten) -> None:
        """Queue one completion for the next batch; ``on_written`` is called once it is
        decided. Only while ``running``."""
        self._add(_Item(completion, on_written, retry=True))

    async def complete(self, completion: Completion) -> bool:
        """Write one completion; True when applied, False when fenced off. Raises what the
        store raised, so the caller may retry."""
        if not self._running:
            result = await self.store.complete_many(self.worker_id, [completion])
            return completion.run_id in result.applied
        done = anyio.Event()
        outcome: list[WriteResult] = []

        def written(result: WriteResult) -> None:
            outcome.append(result)
            done.set()

        self._add(_Item(completion, written, retry=False))
        await done.wait()
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    def _add(self, item: _Item) -> None:
        self._pending.append(item)
        self._has_items.set()
        if self._flush_now():
            self._full.set()

    async def run(self) -> None:
        """Flush batches until cancelled (``writers`` at once); what is still pending then
        fails."""
        self._running = True
        try:
            async with anyio.create_task_group() as writers:
                for _ in range(self.config.writers):
                    writers.start_soon(self._write_batches)
        finally:
            self._running = False
            stopped = RuntimeError("completer stopped")
            for item in self._take(len(self._pending)):
                item.on_written(stopped)

    async def _write_batches(self) -> None:
        while True:
            await self._has_items.wait()
            with anyio.move_on_after(self.config.max_wait_seconds):
                await self._full.wait()
            retry_in = await self._flush()
            if retry_in is not None:
                await anyio.sleep(retry_in)

    def _flush_now(self) -> bool:
        """A full batch, or pending completions that no executing handler could join."""
        if not self._pending:
            return False
        if len(self._pending) >= self.config.max_batch:
            return True
        return self._executing is not None and self._executing() == 0

    def _take(self, count: int) -> list[_Item]:
        batch, self._pending = self._pending[:count], self._pending[count:]
        if not self._pending:
            self._has_items = anyio.Event()
        if not self._flush_now():
            self._full = anyio.Event()
        return batch

    async def _flush(self) -> float | None:
        """Write one batch. When the database was away and hand-ins wait to be written
        again: the seconds to back off first; else None."""
        batch = self._take(self.config.max_batch)
        if not batch:
            return None
        try:
            # Shielded (with a deadline): a batch abandoned mid-write would leave its
            # completions undecided.
            with anyio.fail_after(WRITE_TIMEOUT_SECONDS, shield=True):
                result = await self.store.complete_many(
                    self.worker_id, [item.completion for item in batch]
                )
        except Exception as e:
            return self._failed(batch, e)
        self._retry.succeeded()
        applied = set(result.applied)
        for item in batch:
            item.on_written(item.completion.run_id in applied)
        return None

    def _failed(self, batch: list[_Item], error: Exception) -> float | None:
        # Counted as the executor's settle writes were before completions were batched
        # here, so dashboards and tests that watch ``service="executor"`` still see them.
        STORE_ERRORS.labels(service="executor").inc()
        transient = isinstance(error, UNAVAILABLE_ERRORS)
        again = [item for item in batch if transient and item.retry]
        for item in batch:
            if not (transient and item.retry):
                item.on_written(error)
        if not again:
            return None
        retry_in = self._retry.failed(error, runs=len(again))
        self._pending[:0] = again
        self._has_items.set()
        if self._flush_now():
            self._full.set()
        return retry_in
