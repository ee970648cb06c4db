"""Run ids as people type them: a whole id, or a prefix that names exactly one run (as
git does with commit ids), so an id cut short by a narrow terminal is still usable."""

from __future__ import annotations

from runq.errors import NotFound, RunqError
from runq.store.base import Store

#: How many candidates an ambiguous prefix lists.
CANDIDATES_SHOWN = 10


class AmbiguousRunId(RunqError):
    """A prefix that starts more than one run id."""


async def resolve_run_id(store: Store, text: str) -> str:
    """The run id ``text`` names: itself when a run has that id, else the one run whose id
    starts with it. Raises ``NotFound`` for none and ``AmbiguousRunId`` for several."""
    if not text:
        raise NotFound("no run id given")
    if await store.get(text) is not None:
        return text
    matches = await store.run_ids_with_prefix(text, limit=CANDIDATES_SHOWN + 1)
    if not matches:
        raise NotFound(f"no run {text}")
    if len(matches) > 1:
        shown = matches[:CANDIDATES_SHOWN]
        more = " ..." if len(matches) > CANDIDATES_SHOWN else ""
        raise AmbiguousRunId(
            f"{text} is the start of several run ids; give more of it: {', '.join(shown)}{more}"
        )
    return matches[0]
