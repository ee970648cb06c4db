"""The overview's chart: runs completed and failed per minute over the last hour.

The counts come from one grouped read over the final runs' ``completed_at`` index
(``Store.finished_per_minute``), cached per process for ``CACHE_SECONDS`` exactly like the
exporter's numbers: however many overview tabs are open, the database answers one such
read every few seconds at most. The chart is an SVG drawn here, on the server (no chart
library, no script), with a title, a description that says what it shows in words, and
the same numbers as a table for anyone who cannot see it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import anyio

#: The chart covers this many minutes, the current one last.
MINUTES = 60
#: The counts are re-read at most this often (the exporter's cache lasts as long).
CACHE_SECONDS = 5.0
#: The SVG's drawing area, in user units (it scales with the page).
WIDTH = 960.0
HEIGHT = 170.0
LEFT = 36.0
BOTTOM = 20.0
TOP = 8.0

Rows = Sequence[tuple[float, str, int]]


@dataclass(frozen=True)
class Minute:
    start: float
    completed: int
    failed: int

    @property
    def total(self) -> int:
        return self.completed + self.failed


@dataclass(frozen=True)
class Bar:
    """One minute's stacked bar, in SVG units: completed at the bottom, failed above."""

    minute: Minute
    x: float
    width: float
    completed_y: float
    completed_height: float
    failed_y: float
    failed_height: float


@dataclass(frozen=True)
class Throughput:
    now: float
    minutes: tuple[Minute, ...]

    @property
    def completed(self) -> int:
        return sum(m.completed for m in self.minutes)

    @property
    def failed(self) -> int:
        return sum(m.failed for m in self.minutes)

    @property
    def peak(self) -> int:
        return max((m.total for m in self.minutes), default=0)

    @property
    def busiest(self) -> Minute | None:
        best = max(self.minutes, key=lambda m: m.total, default=None)
        return best if best is not None and best.total else None

    @property
    def active_minutes(self) -> list[Minute]:
        """The minutes with any run settled, newest first: the table fallback's rows."""
        return [m for m in reversed(self.minutes) if m.total]

    @property
    def scale(self) -> int:
        """The y axis' top: the peak rounded up to a readable number (at least 1)."""
        peak = max(self.peak, 1)
        for step in (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000):
            if peak <= step:
                return step
        return peak

    def bars(self) -> list[Bar]:
        plot_width = WIDTH - LEFT
        plot_height = HEIGHT - BOTTOM - TOP
        slot = plot_width / max(len(self.minutes), 1)
        unit = plot_height / self.scale
        base = HEIGHT - BOTTOM
        bars = []
        for i, m in enumerate(self.minutes):
            completed_height = m.completed * unit
            failed_height = m.failed * unit
            bars.append(
                Bar(
                    minute=m,
                    x=round(LEFT + i * slot + 1, 2),
                    width=round(max(slot - 2, 1), 2),
                    completed_y=round(base - completed_height, 2),
                    completed_height=round(completed_height, 2),
                    failed_y=round(base - completed_height - failed_height, 2),
                    failed_height=round(failed_height, 2),
                )
            )
        return bars


def throughput_from_rows(now: float, rows: Rows, minutes: int = MINUTES) -> Throughput:
    """Per-minute buckets ending with the current minute; completed and failed only (a
    cancel is an operator's decision, not the queue's throughput)."""
    current = int(now // 60) * 60
    first = current - (minutes - 1) * 60
    completed = [0] * minutes
    failed = [0] * minutes
    for minute, status, n in rows:
        i = int((minute - first) // 60)
        if not 0 <= i < minutes:
            continue
        if status == "completed":
            completed[i] += n
        elif status == "failed":
            failed[i] += n
    return Throughput(
        now=now,
        minutes=tuple(
            Minute(start=float(first + i * 60), completed=completed[i], failed=failed[i])
            for i in range(minutes)
        ),
    )


class ThroughputCache:
    """The last read, shared by every request of this process; one read at a time."""

    def __init__(
        self,
        read: Callable[[], Awaitable[tuple[float, Rows]]],
        cache_seconds: float = CACHE_SECONDS,
    ) -> None:
        self._read = read
        self._cache_seconds = cache_seconds
        self._lock = anyio.Lock()
        self._value: Throughput | None = None
        self._read_at = float("-inf")

    async def get(self) -> Throughput:
        async with self._lock:
            if self._value is not None and time.monotonic() - self._read_at < self._cache_seconds:
                return self._value
            try:
                now, rows = await self._read()
            except Exception:
                if self._value is None:
                    raise
                return self._value  # the last counts, as the exporter serves its last values
            self._value = throughput_from_rows(now, rows)
            self._read_at = time.monotonic()
            return self._value
