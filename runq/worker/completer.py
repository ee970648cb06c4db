"""Batched completions: the results of many runs in one fenced ``complete_many``.

Executions hand their completion to ``complete()`` and wait. While ``run()`` is active,
completions are collected for up to ``max_wait`` (5 ms) or ``max_batch`` (64) items,
whichever comes first, and written in one statement: one round trip and one commit for
many runs is what lets fast handlers drain a queue at database speed. A batch is written at
once when no handler is still executing: nothing else can join it soon, and waiting would
only delay the write (with 16 slots and fast handlers the 5 ms wait paced the drain).
Without ``run()`` (the ``sync`` transport, ``runq work``), each completion is written on
its own at once.
A completion fenced off (the lease was lost) is reported to its caller, which counts it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from runq.config import Config
from runq.model import Completion
from runq.store.base import Store

WRITE_TIMEOUT_SECONDS = 30.0
#: Tuning, not configuration: the most completions one statement writes, and how long the
#: first completion of a batch waits for others.
MAX_BATCH = 64
MAX_WAIT_SECONDS = 0.005


@dataclass(frozen=True)
class CompleterConfig:
    #: The most completions one statement writes.
    max_batch: int
    #: How long the first completion of a batch waits for others.
    max_wait_seconds: float

    @classmethod
    def from_config(cls, config: Config) -> CompleterConfig:
        """No ``[queue]`` key tunes batching; the parameter keeps one shape for every service."""
        del config
        return cls(max_batch=MAX_BATCH, max_wait_seconds=MAX_WAIT_SECONDS)


@dataclass
class _Waiter:
    completion: Completion
    done: anyio.Event = field(default_factory=anyio.Event)
    applied: bool = False
    error: BaseException | None = None


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
        self._pending: list[_Waiter] = []
        self._has_items = anyio.Event()
        self._full = anyio.Event()
        self._running = False

    async def complete(self, completion: Completion) -> bool:
        """Write one completion; True when applied, False when fenced off. Raises what the
        store raised, so the caller may retry."""
        if not self._running:
            result = await self.store.complete_many(self.worker_id, [completion])
            return completion.run_id in result.applied
        waiter = _Waiter(completion)
        self._pending.append(waiter)
        self._has_items.set()
        if self._flush_now():
            self._full.set()
        await waiter.done.wait()
        if waiter.error is not None:
            raise waiter.error
        return waiter.applied

    async def run(self) -> None:
        """Flush batches until cancelled; pending waiters then fail so callers write alone."""
        self._running = True
        try:
            while True:
                await self._has_items.wait()
                with anyio.move_on_after(self.config.max_wait_seconds):
                    await self._full.wait()
                await self._flush()
        finally:
            self._running = False
            for waiter in self._take(len(self._pending)):
                waiter.error = RuntimeError("completer stopped")
                waiter.done.set()

    def _flush_now(self) -> bool:
        """A full batch, or pending completions that no executing handler could join."""
        if not self._pending:
            return False
        if len(self._pending) >= self.config.max_batch:
            return True
        return self._executing is not None and self._executing() == 0

    def _take(self, count: int) -> list[_Waiter]:
        batch, self._pending = self._pending[:count], self._pending[count:]
        if not self._pending:
            self._has_items = anyio.Event()
        if not self._flush_now():
            self._full = anyio.Event()
        return batch

    async def _flush(self) -> None:
        batch = self._take(self.config.max_batch)
        if not batch:
            return
        try:
            # Shielded (with a deadline): a batch abandoned mid-write would leave callers waiting.
            with anyio.fail_after(WRITE_TIMEOUT_SECONDS, shield=True):
                result = await self.store.complete_many(
                    self.worker_id, [w.completion for w in batch]
                )
        except Exception as e:
            for waiter in batch:
                waiter.error = e
                waiter.done.set()
            return
        applied = set(result.applied)
        for waiter in batch:
            waiter.applied = waiter.completion.run_id in applied
            waiter.done.set()
