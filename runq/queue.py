"""The producer API: what applications, the HTTP layer and the CLI call.

    async with runq.Queue.open("sqlite:///runq.db") as q:
        result = await q.defer("task", "echo", {"hello": "world"})   # stored, never run here
        run = await q.enqueue("task", "echo", {"hi": 1})           # on `sync`: runs here

``defer()`` stores the run and never executes it in the caller; it sends a wake-up only
when the component's route is not ``sync`` (a failed wake-up is logged and the row stays
queued). ``enqueue()`` stores the run and then dispatches it: on ``sync`` the caller claims
it by id and executes it with the daemon's executor, returning the run as it ended; on
other routes the dispatch is the wake-up. A failed dispatch fails the run, so nothing is
left queued that nobody will run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import msgspec

from runq.components import ComponentRegistry
from runq.config import Config, load_config
from runq.errors import BadRequest, NotFound, StoreUnavailable, UnknownComponent
from runq.follow import follow_events, run_events, wait_for_outcome
from runq.log import get_logger
from runq.metrics import SUBMISSIONS
from runq.model import (
    COMPONENT_TYPES,
    Actor,
    Lease,
    NewRun,
    Run,
    RunEvent,
    Status,
    SubmitResult,
    UniqueSpec,
)
from runq.store import open_store
from runq.store.base import Store
from runq.taskgroups import sole_exception
from runq.transports.dispatch import Dispatcher
from runq.worker.dispatch import dispatch_in_caller
from runq.worker.execution import Interrupt
from runq.worker.registry import new_worker_id
from runq.worker.runtime import WorkerRuntime

log = get_logger(__name__)

#: ``new_run`` fills in every field of this blank with ``msgspec.structs.replace``: several
#: times cheaper than the keyword constructor of a 16-field struct, per item of a bulk submit.
_BLANK_NEW_RUN = NewRun(component_type="", component_id="")

#: Unique keys are compared as given; this bounds what a caller can make the database index.
MAX_UNIQUE_KEY_CHARS = 200
#: The longest uniqueness window accepted (a year).
MAX_UNIQUE_FOR_SECONDS = 366 * 86400.0


def unique_spec(
    key: str | None, for_seconds: float | None, states: Sequence[Status | str] | None
) -> UniqueSpec | None:
    """The uniqueness of a submission, validated (``BadRequest`` names the bad option)."""
    if key is None:
        if for_seconds is not None or states is not None:
            raise BadRequest("unique_for_seconds and unique_states need unique_key")
        return None
    if not key or len(key) > MAX_UNIQUE_KEY_CHARS:
        raise BadRequest(f"unique_key must be 1-{MAX_UNIQUE_KEY_CHARS} characters")
    window = 0.0 if for_seconds is None else float(for_seconds)
    if not 0 <= window <= MAX_UNIQUE_FOR_SECONDS:  # also refuses NaN
        raise BadRequest(f"unique_for_seconds must be between 0 and {MAX_UNIQUE_FOR_SECONDS:g}")
    if states is None:
        return UniqueSpec(key=key, for_seconds=window)
    try:
        chosen = frozenset(Status(s) for s in states)
    except ValueError as e:
        known = ", ".join(s.value for s in Status)
        raise BadRequest(f"unique_states: {e}; known: {known}") from e
    if not chosen:
        raise BadRequest("unique_states must name at least one status")
    return UniqueSpec(key=key, for_seconds=window, states=chosen)


class Queue:
    """A connected queue on one database. Build it with ``Queue.open(...)``."""

    def __init__(
        self,
        config: Config,
        store: Store,
        components: ComponentRegistry,
        *,
        validate_components: bool = True,
    ) -> None:
        self.config = config
        self.store = store
        self.components = components
        #: Who hears of a stored run: its route's wake-up (``runq.transports``).
        self.dispatch = Dispatcher(config.routing, store.notifications())
        #: Refuse submissions for components this process cannot resolve (UnknownComponent).
        self.validate_components = validate_components
        #: The daemon's worker when this queue lives inside ``runq serve``: a ``sync``
        #: dispatch then executes under its leases, heartbeats and drain.
        self.runtime: WorkerRuntime | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        config: Config | None = None,
        migrate: bool = True,
        components: ComponentRegistry | None = None,
    ) -> AbstractAsyncContextManager[Queue]:
        """Connect (and migrate) the store of ``config`` (default: ``load_config()``, with
        ``url`` overriding ``[store] url``); closed when the block ends."""
        if config is None:
            config = load_config(store_url=url)
        elif url:
            config = config.with_store_url(url)
        return cls._opened(config, migrate, components)

    @classmethod
    @asynccontextmanager
    async def _opened(
        cls, config: Config, migrate: bool, components: ComponentRegistry | None
    ) -> AsyncIterator[Queue]:
        registry = components or ComponentRegistry.from_config(config.components)
        sole: BaseException | None = None
        try:
            async with open_store(config) as store:
                if migrate:
                    await store.migrate()
                async with cls.on(store, config, registry) as queue:
                    yield queue
        except BaseExceptionGroup as group:
            sole = sole_exception(group)
            if sole is None:
                raise
        finally:
            if components is None:  # built here, so closed here
                with anyio.CancelScope(shield=True):
                    await registry.aclose()
        if sole is not None:
            raise sole  # the caller's own error, not the notifier's task group around it

    @classmethod
    @asynccontextmanager
    async def on(
        cls, store: Store, config: Config, components: ComponentRegistry
    ) -> AsyncIterator[Queue]:
        """A queue over an open store (the caller closes both): its wake-ups are sent
        while the block runs and flushed when it ends."""
        sole: BaseException | None = None
        try:
            async with anyio.create_task_group() as tg:
                queue = cls(config, store, components)
                tg.start_soon(queue.dispatch.run)
                try:
                    yield queue
                finally:
                    with anyio.CancelScope(shield=True):
                        await queue._flush()
                    tg.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            sole = sole_exception(group)
            if sole is None:
                raise
        if sole is not None:
            raise sole  # the caller's own error, not the task group around it

    async def _flush(self) -> None:
        with anyio.move_on_after(2):
            await self.dispatch.flush()

    # -- routing -----------------------------------------------------------------------------

    def route(self, component_type: str, component_id: str) -> str:
        """The transport of a component: ``sync``, ``local`` or ``postgres``."""
        return self.dispatch.route(component_type, component_id)

    # -- submission --------------------------------------------------------------------------

    def new_run(
        self,
        component_type: str,
        component_id: str,
        payload: Any = None,
        *,
        session_id: str | None = None,
        actor: Actor | None = None,
        configuration: str | None = None,
        idempotency_key: str | None = None,
        max_attempts: int | None = None,
        deployment_id: str | None = None,
        priority: int = 0,
        delay_seconds: float = 0.0,
        origin: str = "python",
        save_request: bool = True,
        unique_key: str | None = None,
        unique_for_seconds: float | None = None,
        unique_states: Sequence[Status | str] | None = None,
        concurrency_key: str | None = None,
        timeout_seconds: float | None = None,
    ) -> NewRun:
        """A ``NewRun`` with this queue's defaults (``max_attempts``, this replica's
        ``deployment_id``), validated.

        ``unique_key``: while a run of the same component with this key exists in one of
        ``unique_states`` (default: every status) and is either not final or was created
        within the last ``unique_for_seconds``, a submission returns that run with
        ``created = False`` instead of a new one, for every user and replica.

        ``timeout_seconds``: this run's handler deadline instead of ``[queue]
        timeout_seconds``; at most ``[queue] max_timeout_seconds`` (else ``BadRequest``)."""
        self._check_component(component_type, component_id)
        if max_attempts is not None and max_attempts < 1:
            raise BadRequest("max_attempts must be >= 1")
        if delay_seconds < 0:
            raise BadRequest("delay_seconds must be >= 0")
        self._check_timeout(timeout_seconds)
        return msgspec.structs.replace(
            _BLANK_NEW_RUN,
            component_type=component_type,
            component_id=component_id,
            payload=payload,
            session_id=session_id,
            actor=actor or _BLANK_NEW_RUN.actor,  # Actor is frozen: one anonymous actor
            configuration=configuration,
            idempotency_key=idempotency_key,
            max_attempts=max_attempts or self.config.queue.max_attempts,
            deployment_id=deployment_id or self.config.queue.deployment,
            priority=priority,
            delay_seconds=delay_seconds,
            origin=origin,
            save_request=save_request,
            unique=unique_spec(unique_key, unique_for_seconds, unique_states),
            concurrency_key=concurrency_key,
            timeout_seconds=None if timeout_seconds is None else float(timeout_seconds),
        )

    def _check_timeout(self, timeout_seconds: float | None) -> None:
        if timeout_seconds is None:
            return
        ceiling = self.config.queue.max_timeout_seconds
        if not 0 < timeout_seconds <= ceiling:  # also refuses NaN
            raise BadRequest(
                f"timeout_seconds {timeout_seconds:g} must be > 0 and at most {ceiling:g} "
                "([queue] max_timeout_seconds)"
            )

    def _check_component(self, component_type: str, component_id: str) -> None:
        if component_type not in COMPONENT_TYPES:
            known = ", ".join(sorted(COMPONENT_TYPES))
            raise BadRequest(f"component_type {component_type!r} is not one of {known}")
        if not component_id:
            raise BadRequest("component_id must not be empty")
        if self.validate_components and not self.components.knows(component_type, component_id):
            raise UnknownComponent(f"unknown component {component_type}/{component_id}")

    async def _store(self, new: NewRun, *, wake: bool = False) -> SubmitResult:
        queue = self.config.queue
        result = await self.store.submit(
            new,
            max_queue_depth=queue.max_queue_depth,
            wake=wake,
            max_delayed=queue.max_delayed,
            max_queued_per_user=queue.max_queued_per_user,
        )
        if result.created:
            SUBMISSIONS.labels(origin=new.origin).inc()
            log.info("run.submitted", run_id=result.run.id, component=result.run.component)
        return result

    async def defer(
        self, component_type: str, component_id: str, payload: Any = None, **options: Any
    ) -> SubmitResult:
        """Store the run; never execute it here. Same options as ``new_run``."""
        result, _ = await self.submit(
            self.new_run(component_type, component_id, payload, **options)
        )
        return result

    async def defer_many(self, items: Sequence[NewRun]) -> list[SubmitResult]:
        """Store every run of ``items`` (each built with ``new_run``) in one transaction, or
        none of them; never execute them here. One result per item, in order.

        Each item follows ``defer``'s rules: an idempotency key already used by the same
        user (or repeated earlier in the batch) answers with that run, ``created = False``;
        a held unique key likewise. The depth gates (``max_queue_depth``, ``max_delayed``,
        ``max_queued_per_user``) must fit the whole batch, else ``QueueFull`` and nothing is
        stored. One wake-up goes out for the whole batch."""
        if not items:
            return []
        queue = self.config.queue
        results = await self.store.submit_batch(
            items,
            max_queue_depth=queue.max_queue_depth,
            max_delayed=queue.max_delayed,
            max_queued_per_user=queue.max_queued_per_user,
        )
        created = [r.run for r in results if r.created]
        for origin, count in Counter(run.origin for run in created).items():
            SUBMISSIONS.labels(origin=origin).inc(count)
        if created:
            log.info("runs.submitted", runs=len(created), first_run_id=created[0].id)
            self.dispatch.wake_batch(created)
        return results

    async def enqueue(
        self, component_type: str, component_id: str, payload: Any = None, **options: Any
    ) -> Run:
        """Store the run and dispatch it; on ``sync`` it executes here and the run is
        returned as it ended. Same options as ``new_run`` (incl. ``save_request``)."""
        new = self.new_run(component_type, component_id, payload, **options)
        result, run = await self.submit(new, background=False)
        return run if run is not None else result.run

    async def submit(
        self, new: NewRun, *, background: bool = True
    ) -> tuple[SubmitResult, Run | None]:
        """``background``: defer semantics, ``(result, None)``. Otherwise enqueue semantics:
        ``(result, run)`` with the run as the dispatch left it (ended, on ``sync``)."""
        # Carrying the wake-up in the submit statement saves a NOTIFY's round trip.
        inline = background and self.dispatch.take_inline_slot(new)
        try:
            result = await self._store(new, wake=inline)
        finally:
            if inline:
                self.dispatch.inline_done()
        if not result.created:
            return result, (None if background else result.run)  # a duplicate is not re-run
        if background:
            if inline:
                self.dispatch.woke_inline()
            else:
                await self.dispatch.wake(result.run, strict=False)
            return result, None
        return result, await self._dispatch(result.run)

    async def _dispatch(self, run: Run) -> Run:
        route = self.route(run.component_type, run.component_id)
        try:
            if route == "sync":
                return await self._execute_here(run)
            await self.dispatch.wake(run, strict=True)
            return run
        except Exception as e:
            log.warning("run.dispatch_failed", run_id=run.id, route=route, error=str(e))
            return await self._fail_undispatched(run, f"dispatch failed: {e}", e)

    async def _execute_here(self, run: Run) -> Run:
        if self.runtime is not None:
            claimed = await self._dispatch_with(self.runtime, run)
        else:
            runtime = WorkerRuntime(
                store=self.store, config=self.config, components=self.components
            )

            def cancel_here(run_id: str) -> None:
                runtime.inflight.interrupt(run_id, Interrupt.CANCELLED)

            # A cancel from this process reaches the execution at once, as in a daemon.
            unsubscribe = self.store.notifications().subscribe(lambda: None, cancel_here)
            try:
                async with runtime.active():
                    claimed = await self._dispatch_with(runtime, run)
            finally:
                unsubscribe()
        if claimed is None:
            log.info("run.left_queued", run_id=run.id)
        return await self.store.get(run.id) or run

    async def _dispatch_with(self, runtime: WorkerRuntime, run: Run) -> Run | None:
        return await dispatch_in_caller(
            self.store,
            runtime,
            run,
            deployment_id=self.config.queue.deployment,
            serialize=self.config.queue.serialize_sessions,
        )

    async def _fail_undispatched(self, run: Run, error: str, cause: Exception) -> Run:
        """Fail a run whose dispatch failed: claim it (if still queued) and fail it for good.
        When even that cannot be written, the original error is raised."""
        worker_id = new_worker_id()
        try:
            current = await self.store.get(run.id)
            if current is not None and current.status is Status.RUNNING and current.locked_by:
                lease, holder = Lease(current.id, current.attempt), current.locked_by
            else:
                claimed = await self.store.claim(
                    worker_id,
                    1,
                    deployment_id=run.deployment_id,
                    serialize_sessions=False,
                    run_id=run.id,
                )
                if not claimed:
                    return current or run
                lease, holder = claimed[0].lease, worker_id
            await self.store.fail(holder, lease, error=error, retryable=False, retry_in_seconds=0)
            return await self.store.get(run.id) or run
        except Exception as e:
            raise StoreUnavailable(f"{error}; and the run could not be failed: {e}") from cause

    # -- a run after its submission ---------------------------------------------------------

    async def get(self, run_id: str) -> Run | None:
        return await self.store.get(run_id)

    async def wait(self, run_id: str, timeout: float | None = None) -> Run:  # noqa: ASYNC109
        """The run once it is final or paused, or as it is after ``timeout`` seconds.
        Raises ``NotFound`` for an unknown run."""
        run = await wait_for_outcome(self.store, run_id, timeout)
        if run is None:
            raise NotFound(f"no run {run_id}")
        return run

    def follow(
        self, run_id: str, *, after: int = 0, keepalive_seconds: float | None = None
    ) -> AsyncIterator[RunEvent | None]:
        """``events`` with a ``None`` every ``keepalive_seconds`` without an event (for the
        keep-alive comments of a server-sent event stream)."""
        return follow_events(self.store, run_id, after=after, keepalive_seconds=keepalive_seconds)

    def events(self, run_id: str, after: int = 0) -> AsyncIterator[RunEvent]:
        """``async for event in queue.events(run_id)``: the stored events after ``after``,
        then live ones from whichever process executes the run, ending after the final one."""
        return run_events(self.store, run_id, after=after)

    async def cancel(self, run_id: str) -> Run:
        """Cancel a run. A running one stops at its next checkpoint or heartbeat, and at
        once where the cancel reaches its executor (this process, or any replica over the
        postgres channel)."""
        run = await self.store.cancel(run_id)
        if run.status is Status.RUNNING:
            await self.dispatch.cancel(run_id)
        elif run.status is Status.CANCELLED:
            # Settled here, not by an executor: trim its events as the executor would.
            privacy = self.config.privacy
            await self.store.trim_events(run_id, privacy.level, privacy.redacted_max_chars)
        return run

    async def continue_(self, run_id: str, decision: Any) -> Run:
        run = await self.store.continue_(run_id, decision)
        if run.status is Status.QUEUED:
            await self.dispatch.wake(run, strict=False)
        return run

    async def requeue(
        self, run_id: str, *, clear_cancellation: bool = False, force: bool = False
    ) -> Run:
        run = await self.store.requeue(
            run_id,
            clear_cancellation=clear_cancellation,
            force=force,
            lock_grace_seconds=self.config.queue.lock_grace_seconds,
        )
        await self.dispatch.wake(run, strict=False)
        return run
