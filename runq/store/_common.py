"""Engine-neutral helpers shared by the SQLite and Postgres stores.

Row decoding, JSON + seal encoding of the sealed columns, actor encoding, the texts
the store writes into ``error`` and its refusal messages, and the migration files.
Nothing here knows an SQL dialect beyond ``||`` and column names of the fixed schema.

Owned by the SQLite store's author; the Postgres store may ADD functions here, but
must not change the existing ones (both engines rely on their exact behaviour).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol

import msgspec

from runq.errors import InvalidPayload, SealError
from runq.model import (
    DEFAULT_SORT_BY,
    SORTABLE_FIELDS,
    Actor,
    Resume,
    Run,
    Status,
    TerminationReason,
)
from runq.seal import Sealer

# -- JSON and sealing -------------------------------------------------------------------

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()
_actor_decoder = msgspec.json.Decoder(Actor)


def encode_json(value: Any) -> bytes:
    """msgspec JSON; anything it cannot encode is the caller's mistake → ``InvalidPayload``."""
    try:
        return _encoder.encode(value)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as e:
        raise InvalidPayload(f"value cannot be encoded as JSON: {e}") from e


def seal_json(sealer: Sealer, column: str, run_id: str, value: Any) -> bytes:
    """Encode ``value`` as JSON and seal it for (column, run). ``None`` is sealed as ``null``."""
    return sealer.seal(column, run_id, encode_json(value))


def seal_encoded(sealer: Sealer, column: str, run_id: str, encoded: bytes | None) -> bytes | None:
    """Seal an already-encoded JSON value; ``None`` stays NULL (no value kept)."""
    return None if encoded is None else sealer.seal(column, run_id, encoded)


def open_json(sealer: Sealer, column: str, run_id: str, sealed: bytes | None) -> Any:
    """Open and decode a sealed column; NULL decodes to ``None``."""
    if sealed is None:
        return None
    plaintext = sealer.open(column, run_id, bytes(sealed))
    try:
        return _decoder.decode(plaintext)
    except msgspec.DecodeError as e:
        raise SealError(f"run {run_id}: {column} opened but is not JSON") from e


# -- actor ------------------------------------------------------------------------------


def encode_actor(actor: Actor) -> str:
    return _encoder.encode(actor).decode()


@functools.lru_cache(maxsize=4096)
def decode_actor(text: str) -> Actor:
    # Cached: a queue holds many runs of few actors, and Actor is frozen, so sharing is safe.
    return _actor_decoder.decode(text)


# -- rows -------------------------------------------------------------------------------

#: Every column of the run table, in schema order (for explicit SELECT / RETURNING lists).
RUN_COLUMNS: tuple[str, ...] = (
    "id",
    "component_type",
    "component_id",
    "status",
    "attempt",
    "max_attempts",
    "priority",
    "session_id",
    "user_id",
    "actor",
    "configuration",
    "deployment_id",
    "idempotency_key",
    "origin",
    "created_at",
    "updated_at",
    "available_at",
    "started_at",
    "completed_at",
    "continued_at",
    "locked_by",
    "locked_at",
    "error",
    "termination_reason",
    "pause_reason",
    "cancel_requested",
    "non_idempotent",
    "has_request",
    "payload",
    "answer",
    "resume_state",
    "decision",
    "tokens",
    "cost",
)
RUN_COLUMN_LIST = ", ".join(RUN_COLUMNS)


class RowLike(Protocol):
    """What a row must offer: lookup by column name (sqlite3.Row, asyncpg.Record, dict)."""

    def __getitem__(self, key: str, /) -> Any: ...


def row_to_run(row: RowLike, sealer: Sealer) -> Run:
    """A run-table row (sqlite3.Row, asyncpg.Record or dict) → an opened ``Run``.

    ``resume`` is None while neither resume state nor decision is stored; a paused run
    shows its state (decision None), a continued run both.
    """
    run_id: str = row["id"]
    resume_state = row["resume_state"]
    decision = row["decision"]
    resume = None
    if resume_state is not None or decision is not None:
        resume = Resume(
            state=open_json(sealer, "resume_state", run_id, resume_state),
            decision=open_json(sealer, "decision", run_id, decision),
        )
    reason = row["termination_reason"]
    return Run(
        id=run_id,
        component_type=row["component_type"],
        component_id=row["component_id"],
        status=Status(row["status"]),
        attempt=row["attempt"],
        max_attempts=row["max_attempts"],
        priority=row["priority"],
        session_id=row["session_id"],
        user_id=row["user_id"],
        actor=decode_actor(row["actor"]),
        configuration=row["configuration"],
        deployment_id=row["deployment_id"] or None,
        idempotency_key=row["idempotency_key"],
        origin=row["origin"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        available_at=row["available_at"],
        started_at=row["started_at"],
        completed_at=row["completed_at"],
        locked_by=row["locked_by"],
        locked_at=row["locked_at"],
        error=row["error"],
        termination_reason=TerminationReason(reason) if reason is not None else None,
        pause_reason=row["pause_reason"],
        cancel_requested=bool(row["cancel_requested"]),
        non_idempotent=bool(row["non_idempotent"]),
        has_request=bool(row["has_request"]),
        payload=open_json(sealer, "payload", run_id, row["payload"]),
        answer=open_json(sealer, "answer", run_id, row["answer"]),
        resume=resume,
        tokens=row["tokens"],
        cost=row["cost"],
    )


# -- listing ----------------------------------------------------------------------------


def sort_column(sort_by: str) -> str:
    """A whitelisted column name; anything else falls back to ``created_at``."""
    return sort_by if sort_by in SORTABLE_FIELDS else DEFAULT_SORT_BY


def sort_direction(sort_order: str) -> str:
    return "ASC" if sort_order.lower() == "asc" else "DESC"


#: Sortable columns that may hold NULL (the others are NOT NULL in the schema).
_NULLABLE_SORT_FIELDS = frozenset({"completed_at", "user_id"})


def order_by_sql(sort_by: str, sort_order: str) -> str:
    """``ORDER BY`` body for the listing: whitelisted column, NULLs last in both directions
    (both engines spell it the same; their defaults differ), id as the tie-breaker so pages
    never overlap."""
    column, direction = sort_column(sort_by), sort_direction(sort_order)
    # NULLS LAST only where a NULL can occur: on a NOT NULL column it would only stop
    # SQLite from walking an index in order.
    nulls = " NULLS LAST" if column in _NULLABLE_SORT_FIELDS else ""
    return f"{column} {direction}{nulls}, id {direction}"


# -- texts the store writes or raises ---------------------------------------------------

REAP_NON_IDEMPOTENT_ERROR = "lease expired inside a non-idempotent write section; not retried"
REAP_NO_REQUEST_ERROR = "lease expired and no saved request to retry"
_REAP_EXHAUSTED = (
    "lease expired after attempt {attempt} of {max_attempts}; "
    "requeue with `runq jobs requeue {id}` or raise max_attempts"
)


def reap_exhausted_error(run_id: str, attempt: int, max_attempts: int) -> str:
    return _REAP_EXHAUSTED.format(id=run_id, attempt=attempt, max_attempts=max_attempts)


def reap_exhausted_error_sql() -> str:
    """The same text as an SQL expression over the row's columns (``||`` works on both
    engines, and both cast the integers to text)."""
    parts = re.split(r"\{(\w+)\}", _REAP_EXHAUSTED)
    out: list[str] = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(part)  # a column name: id, attempt, max_attempts
        elif part:
            out.append("'" + part.replace("'", "''") + "'")
    return "(" + " || ".join(out) + ")"


def not_found(run_id: str) -> str:
    return f"no run {run_id}"


def cancel_refused(run_id: str, status: str) -> str:
    return f"run {run_id} is {status}; a finished run cannot be cancelled"


def continue_refused(run_id: str, status: str) -> str:
    return (
        f"run {run_id} is {status} and not waiting for a decision; "
        "only a paused run can be continued"
    )


def requeue_refused(run_id: str, status: str) -> str:
    return f"run {run_id} is {status}; only failed or cancelled runs can be requeued"


def requeue_too_soon(run_id: str, lock_grace_seconds: float) -> str:
    return (
        f"run {run_id} failed less than lock_grace_seconds ({lock_grace_seconds:g}s) ago; "
        "its worker may still be executing. Wait, or requeue with force"
    )


def idempotency_conflict(key: str, existing_component: str) -> str:
    return f"idempotency key {key!r} is already used for {existing_component}"


def queue_full(max_queue_depth: int) -> str:
    return f"the queue is full: {max_queue_depth} runs are queued (queue.max_queue_depth)"


# -- migrations -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str  # with {schema} still in place


_MIGRATION_RE = re.compile(r"^(\d{4})_(\w+)\.sql$")


def load_migrations(engine: str) -> list[Migration]:
    """``runq/store/migrations/<engine>/NNNN_name.sql`` in version order (package data)."""
    folder = resources.files("runq.store").joinpath("migrations", engine)
    found: list[Migration] = []
    for entry in folder.iterdir():
        m = _MIGRATION_RE.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    found.sort(key=lambda mig: mig.version)
    return found


def split_sql(script: str) -> list[str]:
    """Split a migration script into statements at ``;`` line ends, dropping ``--`` comments.

    Migration files keep to that layout (no ``;`` inside string literals or bodies), so a
    plain split is enough and each statement can run inside the migrating transaction.
    """
    lines = [ln for ln in script.splitlines() if not ln.lstrip().startswith("--")]
    statements = [s.strip() for s in "\n".join(lines).split(";")]
    return [s for s in statements if s]
