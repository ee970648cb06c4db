"""What an acknowledgement survives: the database's replication mode, read at start, by
``runq status`` and after every move to a new primary.

On PostgreSQL a commit that runq acknowledged (a submission, a completion) is on the
primary's disk. Whether it is also on a standby decides what a failover can lose:

* ``synchronous``: ``synchronous_standby_names`` is set and runq's sessions commit with
  ``synchronous_commit`` ``on`` or ``remote_apply``, so no commit is acknowledged before a
  standby has flushed it; a failover to that standby loses no acknowledged write.
* ``asynchronous``: standbys stream, but a commit is acknowledged before any has it; a
  failover can lose the last acknowledged writes (those the standby had not received).
* ``none``: no standby (or none PostgreSQL can see, as with a cloud's storage-level
  replication); an acknowledgement is as durable as this server's disk. SQLite is always
  ``none``.

``[store] require_synchronous_replication`` refuses to start unless the mode is
``synchronous`` (``check_required``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

import msgspec

from runq.errors import ConfigError
from runq.log import get_logger

if TYPE_CHECKING:
    from runq.store.base import Store

log = get_logger(__name__)

#: ``synchronous_commit`` levels at which a commit waits for a standby's flush (``on``
#: waits for the flush, ``remote_apply`` for the replay as well).
FLUSHED_ON_STANDBY = ("on", "remote_apply")


class ReplicationMode(StrEnum):
    NONE = "none"
    ASYNCHRONOUS = "asynchronous"
    SYNCHRONOUS = "synchronous"


class Standby(msgspec.Struct, frozen=True):
    """One row of ``pg_stat_replication``; ``state``/``sync_state`` are empty where the
    role may not see them (grant ``pg_monitor``)."""

    name: str
    state: str
    sync_state: str


class ReplicationReport(msgspec.Struct, frozen=True):
    mode: ReplicationMode
    #: The server written to: ``host:port`` of the current primary, or the SQLite file.
    server: str
    #: ``synchronous_standby_names`` as the server has it ("" when unset or on SQLite).
    synchronous_standby_names: str = ""
    #: ``synchronous_commit`` of runq's submission and completion sessions.
    synchronous_commit: str = ""
    standbys: tuple[Standby, ...] = ()

    @property
    def synchronous_standbys(self) -> int:
        return sum(1 for s in self.standbys if s.sync_state in ("sync", "quorum"))

    @property
    def guarantee(self) -> str:
        """One sentence: what an acknowledged write survives in this mode."""
        if self.mode is ReplicationMode.SYNCHRONOUS:
            text = (
                "every acknowledged write is on a synchronous standby too: "
                "a failover to it loses none"
            )
            if not self.synchronous_standbys and self.standbys_visible:
                text += " (no synchronous standby connected now: commits wait for one)"
            return text
        if self.mode is ReplicationMode.ASYNCHRONOUS:
            return (
                "standbys replicate asynchronously: a failover can lose the last "
                "acknowledged writes"
            )
        return "no standby: acknowledged writes are as durable as this server's disk"

    @property
    def standbys_visible(self) -> bool:
        """False when the role cannot read the standbys' state (pg_stat_replication hides it)."""
        return all(s.state for s in self.standbys)

    def log(self) -> None:
        """The ``store.replication`` line: at start, and after each move to a new primary."""
        log.info(
            "store.replication",
            mode=self.mode.value,
            server=self.server,
            synchronous_standby_names=self.synchronous_standby_names or None,
            synchronous_commit=self.synchronous_commit or None,
            standbys=", ".join(f"{s.name} ({s.sync_state or '?'})" for s in self.standbys) or None,
            guarantee=self.guarantee,
        )


def replication_mode(standby_names: str, synchronous_commit: str, standbys: int) -> ReplicationMode:
    """The mode from the server's settings and the number of standbys streaming."""
    if standby_names.strip() and synchronous_commit in FLUSHED_ON_STANDBY:
        return ReplicationMode.SYNCHRONOUS
    if standbys or standby_names.strip():
        return ReplicationMode.ASYNCHRONOUS
    return ReplicationMode.NONE


async def check_at_start(store: Store, *, required: bool, announce: bool = True) -> None:
    """Read the mode, log it (``announce``), and refuse to start when synchronous
    replication is ``required`` and absent (``check_required``)."""
    if not (announce or required):
        return
    report = await store.replication()
    if announce:
        report.log()
    check_required(report, required=required)


def check_required(report: ReplicationReport, *, required: bool) -> None:
    """``[store] require_synchronous_replication``: a ``ConfigError`` naming the key unless
    the database replicates synchronously."""
    if not required or report.mode is ReplicationMode.SYNCHRONOUS:
        return
    state = "has no standby" if report.mode is ReplicationMode.NONE else "replicates asynchronously"
    raise ConfigError(
        "store.require_synchronous_replication",
        f"the database at {report.server} {state} "
        f"(synchronous_standby_names = {report.synchronous_standby_names!r}, "
        f"synchronous_commit = {report.synchronous_commit!r}): an acknowledged run could "
        "be lost in a failover. Name a synchronous standby in synchronous_standby_names "
        "on the primary, or set this key to false",
    )
