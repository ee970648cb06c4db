"""The in-flight registry: the executions of one worker, by run id.

The heartbeat renews their leases in one statement, the claimer counts free slots from
it, a cancel or a lost lease reaches an execution through it, and the drain waits until
it is empty. It also keeps how long handlers take lately, which tells the claimer whether
claiming ahead of free slots pays.
"""

from __future__ import annotations

import anyio

from runq.model import Lease
from runq.worker.execution import Execution, Interrupt

#: Weight of the newest handler duration in ``handler_seconds`` (an exponential average).
HANDLER_SECONDS_WEIGHT = 0.1


def moving_average(last: float | None, value: float, weight: float) -> float:
    """An exponential moving average: ``value`` alone when there is none yet."""
    return value if last is None else last + weight * (value - last)


class InFlight:
    """The executions of one worker, by run id: what the heartbeat renews and the drain waits on."""

    def __init__(self) -> None:
        self._by_id: dict[str, Execution] = {}
        self._handed_in = 0
        self._waiting = 0
        self._empty = anyio.Event()
        self._empty.set()
        #: How long a handler took lately (seconds, a moving average; None: none yet).
        self.handler_seconds: float | None = None

    def __len__(self) -> int:
        return len(self._by_id)

    @property
    def executing(self) -> int:
        """Executions whose handler runs (or is about to): what ``max_concurrency`` bounds.
        Neither a run whose completion waits for its write nor one claimed ahead counts."""
        return len(self._by_id) - self._handed_in - self._waiting

    @property
    def waiting(self) -> int:
        """Runs claimed ahead of a free slot, not started yet."""
        return self._waiting

    def hand_in(self, execution: Execution, handler_seconds: float | None = None) -> None:
        """The handler is done (its completion goes to the completer): the slot is free."""
        if not execution.handed_in and self._by_id.get(execution.run.id) is execution:
            execution.handed_in = True
            self._handed_in += 1
        if handler_seconds is not None:
            self.note_handler_seconds(handler_seconds)

    def note_handler_seconds(self, seconds: float) -> None:
        self.handler_seconds = moving_average(self.handler_seconds, seconds, HANDLER_SECONDS_WEIGHT)

    def add(self, execution: Execution, *, waiting: bool = False) -> None:
        self._by_id[execution.run.id] = execution
        if waiting:
            execution.waiting = True
            self._waiting += 1
        if self._empty.is_set():
            self._empty = anyio.Event()

    def start(self, execution: Execution) -> None:
        """A run claimed ahead takes its slot now."""
        if execution.waiting:
            execution.waiting = False
            if self._by_id.get(execution.run.id) is execution:
                self._waiting -= 1

    def remove(self, execution: Execution) -> None:
        if self._by_id.get(execution.run.id) is execution:
            del self._by_id[execution.run.id]
            if execution.handed_in:
                self._handed_in -= 1
            if execution.waiting:
                execution.waiting = False
                self._waiting -= 1
        if not self._by_id:
            self._empty.set()

    def executions(self) -> list[Execution]:
        return list(self._by_id.values())

    def leases(self) -> list[Lease]:
        return [ex.lease for ex in self._by_id.values()]

    def settling(self, run_id: str, attempt: int) -> bool:
        """This attempt's completion is handed to the completer: its write decides the run,
        and a lease found gone meanwhile is most likely that write having landed."""
        execution = self._by_id.get(run_id)
        return execution is not None and execution.run.attempt == attempt and execution.handed_in

    def interrupt(self, run_id: str, reason: Interrupt, attempt: int | None = None) -> bool:
        execution = self._by_id.get(run_id)
        if execution is None or (attempt is not None and execution.run.attempt != attempt):
            return False
        execution.interrupt(reason)
        return True

    async def wait_empty(self) -> None:
        await self._empty.wait()
