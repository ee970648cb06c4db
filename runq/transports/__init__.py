"""Transports wake claimers; they never store anything. The run table is the queue, and
the store owns every conversation with the database, its channel included: a transport
only decides who must hear of a stored run, and when (``dispatch.py``, ``notifier.py``).

- ``sync`` (the default): ``enqueue()`` executes the run in the caller; ``defer()`` sends
  nothing and the next sweep finds the row.
- ``local``: an in-process wake-up for the claimers of a daemon in this process.
- ``postgres``: ``NOTIFY`` on the schema's channel (coalesced), ``LISTEN`` in every replica;
  cancels travel the same channel.
"""

from runq.transports.routing import DEFAULT_ROUTE, TRANSPORT_NAMES, resolve_route

__all__ = ["DEFAULT_ROUTE", "TRANSPORT_NAMES", "resolve_route"]
