"""What executes runs in one process: worker id, in-flight registry, heartbeat, completer,
executor. The daemon, ``runq work`` and the ``sync`` transport each build one, so all three
share one code path.

Outside the daemon, ``active()`` runs the heartbeat (and, when batching, the completer)
for as long as the caller executes runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio

from runq.components import ComponentRegistry
from runq.config import Config
from runq.limits.budget import BudgetGate
from runq.metrics import BUDGET_REFUSALS
from runq.store.base import Store
from runq.taskgroups import sole_exception
from runq.worker.completer import Completer, CompleterConfig
from runq.worker.executor import Executor, ExecutorConfig
from runq.worker.heartbeat import Heartbeat, HeartbeatConfig
from runq.worker.inflight import InFlight
from runq.worker.registry import new_worker_id


def _count_refusal(reason: str) -> None:
    BUDGET_REFUSALS.labels(reason=reason).inc()


class WorkerRuntime:
    def __init__(
        self,
        *,
        store: Store,
        config: Config,
        components: ComponentRegistry,
        worker_id: str | None = None,
        on_finished: Callable[[], None] | None = None,
        settle_until_decided: bool = False,
    ) -> None:
        """``settle_until_decided``: see ``ExecutorConfig.from_config`` (the daemon's choice)."""
        self.store = store
        self.config = config
        self.worker_id = worker_id or new_worker_id()
        self.inflight = InFlight()
        self.budget = BudgetGate(config.budget, store, on_refusal=_count_refusal)
        self.completer = Completer(
            store,
            self.worker_id,
            CompleterConfig.from_config(config),
            executing=lambda: self.inflight.executing,
        )
        self.heartbeat = Heartbeat(
            store, self.worker_id, self.inflight, HeartbeatConfig.from_config(config)
        )
        self.executor = Executor(
            store=store,
            config=ExecutorConfig.from_config(config, settle_until_decided=settle_until_decided),
            components=components,
            worker_id=self.worker_id,
            inflight=self.inflight,
            completer=self.completer,
            budget=self.budget,
            on_finished=on_finished,
            renew_soon=self.heartbeat.renew_soon,
        )

    @asynccontextmanager
    async def active(self, *, batching: bool = False) -> AsyncIterator[WorkerRuntime]:
        """Heartbeats (and batched completions) while the block executes runs."""
        sole: BaseException | None = None
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.heartbeat.run)
                if batching:
                    tg.start_soon(self.completer.run)
                try:
                    yield self
                finally:
                    tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            sole = sole_exception(group)
            if sole is None:
                raise
        if sole is not None:
            raise sole  # the block's own error (e.g. StoreUnavailable), unwrapped
