"""Transports wake claimers; they never store anything. The run table is the queue.

- ``sync`` (the default): ``enqueue()`` executes the run in the caller; ``defer()`` sends
  nothing and the next sweep finds the row.
- ``local``: an in-process wake-up for the claimers of a daemon in this process.
- ``postgres``: ``NOTIFY`` on the schema's channel (coalesced), ``LISTEN`` in every replica;
  cancels travel the same channel.
"""

from runq.transports.base import DEFAULT_ROUTE, TRANSPORT_NAMES, resolve_route

__all__ = ["DEFAULT_ROUTE", "TRANSPORT_NAMES", "resolve_route"]
