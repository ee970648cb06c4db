"""Small helpers shared by the tests: waiting on a condition with a deadline, ordered ids.

Tests never sleep-and-hope: they wait for a condition and fail with a message that says
what never happened.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import msgspec

from runq.model import Actor, Run, Status
from runq.queue import Queue
from runq.worker.claimer import Claimer, ClaimerConfig
from runq.worker.runtime import WorkerRuntime

T = TypeVar("T")

Predicate = Callable[[], Any]


async def wait_for(
    predicate: Predicate,
    *,
    timeout: float,  # noqa: ASYNC109 - the deadline is the point of this helper
    interval: float = 0.05,
    message: str,
) -> Any:
    """Await until ``predicate()`` is truthy; return its value.

    ``predicate`` may be sync or return an awaitable. On the deadline, raises
    ``AssertionError`` with ``message`` and the last value seen (or the last exception the
    predicate raised), so the failure says what never happened.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            last, last_error = value, None
            if value:
                return value
        except AssertionError as e:
            last_error = e
        if time.monotonic() >= deadline:
            detail = f"last error: {last_error!r}" if last_error else f"last value: {last!r}"
            raise AssertionError(f"{message} (not within {timeout:g}s; {detail})")
        await anyio.sleep(interval)


def wait_for_sync(
    predicate: Callable[[], Any],
    *,
    timeout: float,
    interval: float = 0.05,
    message: str,
) -> Any:
    """The blocking twin of ``wait_for`` for sync code (threads, subprocesses)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            last, last_error = value, None
            if value:
                return value
        except AssertionError as e:
            last_error = e
        if time.monotonic() >= deadline:
            detail = f"last error: {last_error!r}" if last_error else f"last value: {last!r}"
            raise AssertionError(f"{message} (not within {timeout:g}s; {detail})")
        time.sleep(interval)


async def gather(*awaitables: Awaitable[T]) -> list[T]:
    """Run awaitables concurrently in one task group and return their results in order."""
    results: list[Any] = [None] * len(awaitables)

    async def one(i: int, aw: Awaitable[T]) -> None:
        results[i] = await aw

    async with anyio.create_task_group() as tg:
        for i, aw in enumerate(awaitables):
            tg.start_soon(one, i, aw)
    return results


_id_lock = threading.Lock()
_id_last = [0]


def ordered_run_id() -> str:
    """A UUIDv7-shaped id that is strictly greater than every id this process made before.

    Tests that depend on "oldest first" pass these as ``NewRun.id`` so their ordering does
    not hinge on how many runs fit into one millisecond.
    """
    with _id_lock:
        ms = time.time_ns() // 1_000_000
        # 48 bits of time, then a 74-bit counter space: bump the previous value when the
        # clock has not moved past it.
        candidate = ms << 74
        value = max(candidate, _id_last[0] + 1)
        _id_last[0] = value
    ms_part = value >> 74
    counter = value & ((1 << 74) - 1)
    # Layout: ms(48) | ver(4)=7 | counter high 12 | var(2)=0b10 | counter low 62 bits.
    full = (ms_part & ((1 << 48) - 1)) << 80
    full |= 0x7 << 76
    full |= ((counter >> 62) & 0xFFF) << 64
    full |= 0b10 << 62
    full |= counter & ((1 << 62) - 1)
    h = f"{full:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def approx(expected: float, tolerance: float) -> Callable[[float | None], bool]:
    """A predicate for "within ``tolerance`` of ``expected``" that reads well in asserts."""

    def check(actual: float | None) -> bool:
        return actual is not None and abs(actual - expected) <= tolerance

    return check


def a_run(run_id: str = "r1", **changes: Any) -> Run:
    """A ``Run`` as a store would return it, without a store: queued, attempt 0, no lease;
    ``changes`` replace any field (for unit tests of what reads runs)."""
    run = Run(
        id=run_id,
        component_type="task",
        component_id="echo",
        status=Status.QUEUED,
        attempt=0,
        max_attempts=3,
        priority=0,
        session_id=None,
        user_id=None,
        actor=Actor(),
        configuration=None,
        deployment_id=None,
        idempotency_key=None,
        origin="python",
        created_at=1.0,
        updated_at=1.0,
        available_at=1.0,
        started_at=None,
        completed_at=None,
        locked_by=None,
        locked_at=None,
        error=None,
        termination_reason=None,
        pause_reason=None,
        cancel_requested=False,
        non_idempotent=False,
        has_request=True,
    )
    return msgspec.structs.replace(run, **changes)


def worker_of(
    q: Queue, config: ClaimerConfig, *, store: Any = None, **runtime: Any
) -> tuple[WorkerRuntime, Claimer]:
    """A worker runtime over ``q`` and its claimer (which claims through ``store``, a
    wrapper of the queue's store, when given); a freed slot wakes the claimer, as in the
    daemon. ``runtime``: more ``WorkerRuntime`` arguments."""
    claimers: list[Claimer] = []
    made = WorkerRuntime(
        store=q.store,
        config=q.config,
        components=q.components,
        on_finished=lambda: claimers[0].slot_freed(),
        **runtime,
    )
    claimers.append(Claimer(store or q.store, made, config))
    return made, claimers[0]
