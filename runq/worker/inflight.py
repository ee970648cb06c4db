"""The in-flight registry: the executions of one worker, by run id.

The heartbeat renews their leases in one statement, the claimer counts free slots from
it, a cancel or a lost lease reaches an execution through it, and the drain waits until
it is empty.
"""

from __future__ import annotations

import anyio

from runq.model import Lease
from runq.worker.execution import Execution, Interrupt


class InFlight:
    """The executions of one worker, by run id: what the heartbeat renews and the drain waits on."""

    def __init__(self) -> None:
        self._by_id: dict[str, Execution] = {}
        self._handed_in = 0
        self._empty = anyio.Event()
        self._empty.set()

    def __len__(self) -> int:
        return len(self._by_id)

    @property
    def executing(self) -> int:
        """Executions whose handler still runs: what ``max_concurrency`` bounds."""
        return len(self._by_id) - self._handed_in

    def hand_in(self, execution: Execution) -> None:
        if not execution.handed_in and self._by_id.get(execution.run.id) is execution:
            execution.handed_in = True
            self._handed_in += 1

    def add(self, execution: Execution) -> None:
        self._by_id[execution.run.id] = execution
        if self._empty.is_set():
            self._empty = anyio.Event()

    def remove(self, execution: Execution) -> None:
        if self._by_id.get(execution.run.id) is execution:
            del self._by_id[execution.run.id]
            if execution.handed_in:
                self._handed_in -= 1
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
