"""``runq serve``: one process whose supervisor hosts every service in anyio task groups.

Started in order: the store (migrated), the scheduler, the worker registry, heartbeats, the
completer, the reaper, retention and registry-prune loops, the postgres listener, the
claimers (in their own executions group), the HTTP API, the event-loop-lag sampler and the
systemd watchdog. ``READY=1`` goes out once migrations ran and the first claim pass happened.

Signals only set flags (uvicorn's pattern): the first SIGTERM/SIGINT starts the drain,
a second one stops at once. The drain: ``STOPPING=1``; stop claiming; give
in-flight runs ``stop_timeout_seconds`` while heartbeats continue; then cancel each
straggler once (attempts left → ``queued``, none → ``failed`` with "interrupted by worker
shutdown"); then stop HTTP, remove the worker from the registry and close the store.
Queued runs are untouched. ``[queue] worker = false`` runs the HTTP API only.
"""

from __future__ import annotations

import importlib.util
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup

from runq.components import ComponentRegistry
from runq.config import Config
from runq.errors import ConfigError
from runq.log import get_logger
from runq.loops import run_periodically, service_retry
from runq.maintenance.reaper import Reaper, ReaperConfig
from runq.maintenance.retention import Retention, RetentionConfig
from runq.maintenance.scheduler import Scheduler, check_schedule_components
from runq.metrics import EVENT_LOOP_LAG
from runq.ops.operations import Operations
from runq.queue import Queue
from runq.serve.exporter import Exporter, ExporterConfig
from runq.serve.http_server import (
    HTTP_SHUTDOWN_SECONDS,
    EmbeddedServer,
    bind_listener,
    embedded_server,
)
from runq.serve.systemd import SystemdNotifier
from runq.store.base import Store
from runq.store.replication import check_at_start
from runq.worker.claimer import Claimer, ClaimerConfig
from runq.worker.execution import Interrupt
from runq.worker.registry import WorkerRegistry, WorkerRegistryConfig
from runq.worker.runtime import WorkerRuntime

if TYPE_CHECKING:
    from litestar import Litestar

log = get_logger(__name__)

#: After the stragglers were cancelled, how long their settle writes may take.
STRAGGLER_SETTLE_SECONDS = 5.0
LAG_SAMPLE_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class PreparedHttp:
    """What the HTTP API needs, made before anything is registered."""

    app: Litestar
    sock: socket.socket


class Supervisor:
    def __init__(
        self,
        queue: Queue,
        *,
        notifier: SystemdNotifier | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        self.queue = queue
        self._on_ready = on_ready
        self.config: Config = queue.config
        self.store = queue.store
        self.systemd = notifier or SystemdNotifier()
        config = self.config
        self.worker_enabled = config.queue.worker
        self.runtime = WorkerRuntime(
            store=self.store,
            config=config,
            components=queue.components,
            on_finished=self._slot_freed,
            settle_until_decided=True,
        )
        self.claimer = Claimer(self.store, self.runtime, ClaimerConfig.from_config(config))
        self.reaper = Reaper(
            self.store, ReaperConfig.from_config(config), on_requeued=self._wake_everyone
        )
        self.retention = Retention(self.store, RetentionConfig.from_config(config))
        self.registry = WorkerRegistry(
            self.store,
            WorkerRegistryConfig.from_config(config),
            worker_id=self.runtime.worker_id,
        )
        self.exporter = Exporter(self.store, ExporterConfig.from_config(config))
        self.scheduler = Scheduler(self.store, config)
        self._stop_requested = anyio.Event()
        self._hard_stop = False
        self.draining = False
        self._http: EmbeddedServer | None = None
        self._http_done = anyio.Event()

    # -- wake-ups ------------------------------------------------------------------------------

    def _wake_claimer(self) -> None:
        self.claimer.wake()

    def _slot_freed(self) -> None:
        self.claimer.slot_freed()

    def _wake_everyone(self) -> None:
        """After the reaper requeued: this replica now, the others through the channel."""
        self.queue.dispatch.wake_everywhere()

    def _cancel_local(self, run_id: str) -> None:
        if self.runtime.inflight.interrupt(run_id, Interrupt.CANCELLED):
            log.info("run.cancel_received", run_id=run_id, worker_id=self.runtime.worker_id)

    # -- signals --------------------------------------------------------------------------------

    def request_stop(self) -> None:
        """A drain; called a second time, a stop at once."""
        if self._stop_requested.is_set():
            self._hard_stop = True
        self._stop_requested.set()

    async def _watch_signals(self, main: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                first = not self._stop_requested.is_set()
                self.request_stop()
                if first:
                    log.info("daemon.drain_requested", signal=signal.Signals(signum).name)
                else:
                    log.warning("daemon.stopping_now", signal=signal.Signals(signum).name)
                    main.cancel()

    # -- the run ---------------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve until a signal (or ``request_stop``); returns the exit code."""
        self.queue.runtime = self.runtime if self.worker_enabled else None
        unsubscribe = self.store.notifications().subscribe(self._wake_claimer, self._cancel_local)
        try:
            with anyio.CancelScope() as main:
                async with anyio.create_task_group() as services:
                    services.start_soon(self._watch_signals, main)
                    await self._serve(services)
                    services.cancel_scope.cancel()
        finally:
            unsubscribe()
            self.queue.runtime = None
        if self._hard_stop:
            log.warning("daemon.stopped", graceful=False)
            return 1
        log.info("daemon.stopped", graceful=True)
        return 0

    async def _serve(self, services: TaskGroup) -> None:
        # Everything that can refuse the configuration (the app and its auth secrets, the
        # listen address) is checked before the worker is registered: a start that fails
        # must not leave a "live" worker behind for `runq status` to count.
        http = self._prepare_http()
        services.start_soon(self._sample_loop_lag)
        services.start_soon(self.systemd.watchdog_loop)
        services.start_soon(self.scheduler.run)  # every replica; the database picks one per slot
        if not self.worker_enabled:
            await self._start_http(services, http)
            self._ready()
            await self._stop_requested.wait()
            self._begin_drain()
            await self._stop_http()
            return
        await self.registry.register()
        try:
            await self._serve_worker(services, http)
        except Exception:
            # A start that failed after registering removes what it registered.
            with anyio.CancelScope(shield=True):
                await self._remove_worker()
            raise
        await self._remove_worker()

    async def _serve_worker(self, services: TaskGroup, http: PreparedHttp | None) -> None:
        self._start_worker_services(services)
        await self._start_listener(services)
        async with anyio.create_task_group() as executions:
            await services.start(self.claimer.run, executions)
            await self._start_http(services, http)
            self._ready()
            await self._stop_requested.wait()
            await self._drain()
            # Whatever did not settle within the grace (a database away) is left to the
            # reaper of a peer or of the next start: its lease goes stale.
            executions.cancel_scope.cancel()
        await self._stop_http()

    def _start_worker_services(self, services: TaskGroup) -> None:
        services.start_soon(self.runtime.heartbeat.run)
        services.start_soon(self.runtime.completer.run)
        services.start_soon(self.reaper.run)
        services.start_soon(self.retention.run)
        services.start_soon(self._prune_workers)

    async def _prune_workers(self) -> None:
        """Forget workers not seen for long (``runq status`` counts the live ones)."""
        interval = self.registry.config.prune_interval_seconds
        retry = service_retry("workers", interval)
        await run_periodically(self.registry.prune_once, retry=retry, interval=interval)

    async def _start_listener(self, services: TaskGroup) -> None:
        """Hear the other replicas (PostgreSQL's ``LISTEN``): their wake-ups and cancels
        reach the callbacks ``run`` subscribed, their event messages the followers here."""
        await services.start(self.store.notifications().listen)

    def _ready(self) -> None:
        self.systemd.ready()
        log.info(
            "daemon.ready",
            worker_id=self.runtime.worker_id if self.worker_enabled else None,
            worker=self.worker_enabled,
            http=self.config.http.listen or None,
            engine=self.store.engine,
        )
        if self._on_ready is not None:
            self._on_ready()

    def _begin_drain(self) -> None:
        self.draining = True
        self.systemd.stopping()

    async def _drain(self) -> None:
        self._begin_drain()
        inflight = self.runtime.inflight
        timeout = self.config.queue.effective_stop_timeout
        log.info("daemon.draining", in_flight=len(inflight), stop_timeout_seconds=timeout)
        self.claimer.stop()
        await self.claimer.wait_stopped()
        with anyio.move_on_after(timeout):
            await inflight.wait_empty()
        stragglers = inflight.executions()
        for execution in stragglers:
            log.warning(
                "run.straggler_cancelled",
                reason="shutdown",
                run_id=execution.run.id,
                attempt=execution.run.attempt,
                worker_id=self.runtime.worker_id,
            )
            execution.interrupt(Interrupt.SHUTDOWN)
        if stragglers:
            with anyio.move_on_after(STRAGGLER_SETTLE_SECONDS):
                await inflight.wait_empty()
        log.info("daemon.drained", stragglers=len(stragglers))

    async def _remove_worker(self) -> None:
        try:
            with anyio.move_on_after(5):
                await self.registry.remove()
        except Exception as e:
            log.warning("worker.remove_failed", error=str(e))

    # -- HTTP --------------------------------------------------------------------------------------

    async def readiness(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        if self.claimer.refusal is not None:
            return False, self.claimer.refusal
        try:
            with anyio.fail_after(5):
                await self.store.ping()
                if not await self.store.schema_is_current():
                    return False, "schema is not current (run `runq migrate`)"
        except Exception as e:
            return False, f"database unreachable: {e}"
        return True, "ok"

    def _wake_after_operator(self) -> None:
        self.claimer.wake()

    def _prepare_http(self) -> PreparedHttp | None:
        """The app (its auth secrets read) and the bound socket, or None without HTTP.
        Raises ``ConfigError`` for a missing secret or a busy address."""
        listen = self.config.http.host_port
        if listen is None:
            return None
        app = self._build_app()
        if app is None:
            return None
        return PreparedHttp(app, bind_listener(*listen))

    async def _start_http(self, services: TaskGroup, http: PreparedHttp | None) -> None:
        if http is None:
            return
        app, sock = http.app, http.sock
        server = embedded_server(app, self._http_done, self.config.http.request_timeout_seconds)
        self._http = server
        services.start_soon(server.serve, [sock])
        with anyio.fail_after(30):
            while not server.started:
                if server.should_exit:
                    raise RuntimeError("the HTTP server failed to start")
                await anyio.sleep(0.01)
        log.info("http.listening", address=self.config.http.listen)

    def _build_app(self) -> Litestar | None:
        if importlib.util.find_spec("runq.api.app") is None:
            log.warning("http.unavailable", reason="runq.api.app is not installed")
            return None
        from runq.api import ApiServices
        from runq.api.app import create_app
        from runq.ui import ui_routes

        services = ApiServices(
            queue=self.queue,
            ops=Operations(self.store, self.config),
            config=self.config,
            worker_enabled=self.worker_enabled,
            render_metrics=self.exporter.render,
            readiness=self.readiness,
            wake=self._wake_after_operator,
        )
        return create_app(services, extra_routes=ui_routes())

    async def _stop_http(self) -> None:
        server = self._http
        if server is None:
            return
        server.should_exit = True
        with anyio.move_on_after(HTTP_SHUTDOWN_SECONDS + 1):
            await self._http_done.wait()

    # -- event loop lag ------------------------------------------------------------------------

    async def _sample_loop_lag(self) -> None:
        """How late a timer fires: a busy or blocked loop delays heartbeats too."""
        while True:
            before = time.monotonic()
            await anyio.sleep(LAG_SAMPLE_SECONDS)
            EVENT_LOOP_LAG.set(max(time.monotonic() - before - LAG_SAMPLE_SECONDS, 0.0))


# -- entry point ----------------------------------------------------------------------------------


async def refuse_a_foreign_seal_key(store: Store) -> None:
    """A replica whose keys cannot open the fleet's values must not start: it would claim
    runs, fail to open them and leave them to the reaper, emptying the queue into the dead
    letters."""
    recorded = await store.check_seal_key()
    if recorded is not None:
        raise ConfigError(
            "seal.keys",
            f"none of these keys opens the fleet's values (they are sealed under key id "
            f"{recorded}); configure the fleet's seal keys",
        )


async def serve(config: Config, *, on_ready: Callable[[], None] | None = None) -> int:
    """Resolve components, open (and migrate) the store, serve until stopped; ``on_ready``
    is called once the daemon is ready."""
    components = ComponentRegistry.from_config(config.components)
    try:
        check_schedule_components(config, components)
        async with AsyncExitStack() as stack:
            queue = await stack.enter_async_context(
                Queue.open(config=config, migrate=True, components=components)
            )
            await refuse_a_foreign_seal_key(queue.store)
            await check_at_start(queue.store, required=config.store.require_synchronous_replication)
            return await Supervisor(queue, on_ready=on_ready).run()
    finally:
        with anyio.CancelScope(shield=True):
            await components.aclose()
    raise AssertionError("unreachable")  # pragma: no cover


def run_serve(config: Config, *, entry: Callable[[Config], Awaitable[int]] = serve) -> int:
    """``anyio.run`` on uvloop where available."""
    options: dict[str, Any] = {}
    if importlib.util.find_spec("uvloop") is not None:
        options["use_uvloop"] = True
    return anyio.run(entry, config, backend="asyncio", backend_options=options)
