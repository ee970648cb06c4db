"""Run listings, engine-neutral: the arguments made sane once, the statements built by
``listing_sql`` in the engine's dialect, the rows read turned into the page, and the two
listing verbs every engine shares (``ListingVerbs``); an engine only reads the rows."""

from __future__ import annotations

from typing import Any, NamedTuple, Unpack

from runq.listing import (
    ALL_RUNS,
    DEFAULT_SORT_BY,
    JobListing,
    Page,
    RunCursor,
    RunFilter,
    RunList,
)
from runq.model import Run
from runq.store.listing_sql import ListingDialect, count_listed, list_page, sort_column


class Listing(NamedTuple):
    """One page of a run listing, engine-neutral: the arguments made sane once, the
    statements built by the engine's builders, and the rows read turned into the page."""

    where: RunFilter
    page: int
    limit: int
    sort_by: str
    sort_order: str
    after: RunCursor | None

    @classmethod
    def of(
        cls,
        where: RunFilter,
        *,
        after: RunCursor | None,
        limit: int,
        page: int = 1,
        sort_by: str = "created_at",
        sort_order: str = "desc",
    ) -> Listing:
        return cls(where, max(int(page), 1), max(int(limit), 1), sort_by, sort_order, after)

    def page_statement(self, dialect: ListingDialect, schema: str) -> tuple[str, list[Any]]:
        """One row more than the page: whether another page follows."""
        return list_page(
            dialect,
            schema,
            self.where,
            after=self.after,
            sort_by=self.sort_by,
            sort_order=self.sort_order,
            limit=self.limit + 1,
            offset=(self.page - 1) * self.limit,
        )

    def count_statement(self, dialect: ListingDialect, schema: str) -> tuple[str, list[Any]]:
        return count_listed(dialect, schema, self.where)

    def trimmed(self, runs: list[Run]) -> tuple[list[Run], str | None]:
        """Rows read with ``limit + 1`` → the page and, when a row follows it and the order
        is (created_at, id), the cursor of the next page."""
        page = runs[: self.limit]
        more = len(runs) > self.limit and bool(page)
        keyset = sort_column(self.sort_by) == "created_at"
        return page, RunCursor.of(page[-1]).encode() if more and keyset else None

    def as_page(self, runs: list[Run], total: int) -> Page:
        data, cursor = self.trimmed(runs)
        return Page(
            data=data, page=self.page, limit=self.limit, total_count=total, next_cursor=cursor
        )

    def as_run_list(self, runs: list[Run]) -> RunList:
        data, cursor = self.trimmed(runs)
        return RunList(data=data, next_cursor=cursor)


class ListingVerbs:
    """``list_jobs`` and ``list_runs`` of both engines, over the engine's ``_read_listing``."""

    async def _read_listing(self, listing: Listing, *, count: bool) -> tuple[int, list[Run]]:
        """The listing's rows (one more than the page) and, when ``count``, how many runs
        its filter matches (else 0), read together."""
        raise NotImplementedError

    async def list_jobs(self, **listing_args: Unpack[JobListing]) -> Page:
        listing = Listing.of(
            listing_args.get("where", ALL_RUNS),
            after=listing_args.get("after"),
            limit=listing_args.get("limit", 20),
            page=listing_args.get("page", 1),
            sort_by=listing_args.get("sort_by", DEFAULT_SORT_BY),
            sort_order=listing_args.get("sort_order", "desc"),
        )
        total, runs = await self._read_listing(listing, count=True)
        return listing.as_page(runs, total)

    async def list_runs(self, where: RunFilter, *, after: RunCursor | None, limit: int) -> RunList:
        listing = Listing.of(where, after=after, limit=limit)
        _, runs = await self._read_listing(listing, count=False)
        return listing.as_run_list(runs)
