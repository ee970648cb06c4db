"""Key rotation: re-seal every run's sealed columns under the sealing key, page by page.

The store re-seals one page per call (``Store.reseal_page``); this service walks the
pages in id order, so a rotation can be interrupted and resumed from the last id it
reported. Safe to run again: values already under the sealing key are left alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from runq.store.base import Store


@dataclass
class RotationReport:
    """Where a rotation got to. ``last_id`` is the id to resume after (``""`` when no page
    was read); ``runs_scanned`` is an upper bound (the page size per page read);
    ``resealed`` counts the values re-sealed; ``done`` is True once no run is left."""

    pages: int = 0
    runs_scanned: int = 0
    resealed: int = 0
    last_id: str = ""
    done: bool = False


#: Called after every page with the report so far (progress bars, resume hints).
OnPage = Callable[[RotationReport], Awaitable[None] | None]


class KeyRotation:
    """Re-seals the run table under the store's sealing key (the first of ``seal.keys``)."""

    def __init__(self, store: Store, *, page_size: int = 500) -> None:
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        self.store = store
        self.page_size = page_size

    async def run_once(self, after_id: str = "", *, page_size: int | None = None) -> RotationReport:
        """Re-seal one page of runs with id > ``after_id``."""
        limit = page_size or self.page_size
        last, resealed = await self.store.reseal_page(after_id=after_id, limit=limit)
        if last is None:
            return RotationReport(last_id=after_id, done=True)
        # reseal_page reports the last id, not the row count; a short page is the last one
        # only if the next call says so, so count a full page as ``limit`` rows at most.
        return RotationReport(pages=1, runs_scanned=limit, resealed=resealed, last_id=last)

    async def run(
        self,
        *,
        page_size: int | None = None,
        after_id: str = "",
        on_page: OnPage | None = None,
    ) -> RotationReport:
        """Re-seal every run with id > ``after_id``, page by page, until none is left.

        If it raises (interrupted, store unavailable), ``on_page`` has seen the last id
        completed: resume with ``after_id`` set to it.
        """
        report = RotationReport(last_id=after_id)
        while True:
            page = await self.run_once(report.last_id, page_size=page_size)
            if page.done:
                report.done = True
                return report
            report.pages += 1
            report.runs_scanned += page.runs_scanned
            report.resealed += page.resealed
            report.last_id = page.last_id
            if on_page is not None:
                result = on_page(report)
                if result is not None:
                    await result
