"""Where a claim starts walking the claim index on PostgreSQL: the queue's head.

Each claim leaves the old entries of the rows it took at the head of ``runs_claim_idx``,
where only VACUUM removes them, so a claim from the start of the index walks every run
claimed since the last vacuum: a drain slows down as it goes (a soak fell to 0.44 of its
first rate between autovacuum passes), and a transaction held open, which stops vacuum,
makes it worse. While claims come back full (a backlog), a claim starts at the head: the
first due queued row, read again every ``HEAD_SECONDS`` (one walk per second instead of one
per claim). A claim that comes back short claims from the start for the rest and stops
using the head until claims are full again, so an emptying queue, or a run given back
before the head, is still found at once.
"""

from __future__ import annotations

import math
import time

import asyncpg

#: How long a head read is used. Rows that enter the queue meanwhile sort after it (they
#: are due now or later), except runs given back unstarted, which keep their place.
HEAD_SECONDS = 1.0


class ClaimHead:
    """The head of one store's queue (runs without a deployment), as last read."""

    def __init__(self) -> None:
        self.key: tuple[int, float, str] | None = None
        self._read_at = -math.inf
        #: The last claim came back full: there is a backlog worth starting at the head.
        self.backlog = False

    def stale(self) -> bool:
        return self.key is None or time.monotonic() - self._read_at >= HEAD_SECONDS

    def read(self, row: asyncpg.Record | None) -> None:
        """The head query's row (None: no due queued run)."""
        self._read_at = time.monotonic()
        self.key = None if row is None else (row["priority"], row["available_at"], row["id"])

    def forget(self) -> None:
        self.key = None
        self.backlog = False
