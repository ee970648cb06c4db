"""Values to and from the run table, engine-neutral: what the SQLite and PostgreSQL stores
write and what they read back.

Values going in (JSON + sealing of the sealed columns, the actor, the insert values of a
``NewRun``, key rotation's re-sealing) and rows coming out (a run-table row to an opened
``Run``, a worker, schedule or pause row to its model). What a verb builds from what its
statement returned is ``verb_results.py``. Nothing here knows an SQL dialect.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import msgspec

from runq.errors import InvalidPayload, SealError
from runq.model import (
    Actor,
    Completion,
    NewRun,
    Pause,
    Resume,
    Run,
    ScheduleState,
    Status,
    TerminationReason,
    WorkerInfo,
)
from runq.seal import Sealer, sealed_key_id

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


def seal_answer(sealer: Sealer, completion: Completion) -> bytes | None:
    """The sealed answer of a completion, or NULL when the answer is not kept or is None
    (NULL opens to None as well; sealing a null was a tenth of a no-op run's CPU)."""
    if not completion.keep_answer or completion.answer is None:
        return None
    return seal_json(sealer, "answer", completion.run_id, completion.answer)


def seal_error_detail(sealer: Sealer, run_id: str, text: str | None) -> bytes | None:
    """A handler's full error text sealed for the run (NULL when there is none): ``error``
    keeps what the privacy level allows, this column the whole message, for admins."""
    return None if text is None else seal_json(sealer, "error_detail", run_id, text)


def open_error_detail(sealer: Sealer, run_id: str, sealed: bytes | None) -> str | None:
    """The opened error detail of a run (None when none was kept)."""
    value = open_json(sealer, "error_detail", run_id, sealed)
    return value if isinstance(value, str) else None


def resealed(sealer: Sealer, column: str, run_id: str, sealed: bytes | None) -> bytes | None:
    """``sealed`` re-sealed under the sealing key, or None when it already is (or is NULL)."""
    if sealed is None or sealed_key_id(bytes(sealed)) == sealer.sealing_key_id:
        return None
    return sealer.seal(column, run_id, sealer.open(column, run_id, bytes(sealed)))


# -- actor ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def encode_actor(actor: Actor) -> str:
    # Cached like decode_actor: a bulk submit carries many runs of few actors.
    return _encoder.encode(actor).decode()


@functools.lru_cache(maxsize=4096)
def decode_actor(text: str) -> Actor:
    # Cached: a queue holds many runs of few actors, and Actor is frozen, so sharing is safe.
    return _actor_decoder.decode(text)


# -- values going in --------------------------------------------------------------------


class InsertValues(NamedTuple):
    """The columns a submit writes, in the order both engines' INSERT statements take them."""

    id: str
    component_type: str
    component_id: str
    max_attempts: int
    priority: int
    session_id: str | None
    user_id: str | None
    actor: str
    configuration: str | None
    deployment_id: str
    idempotency_key: str | None
    origin: str
    delay: float
    has_request: bool
    payload: bytes | None


def insert_values(new: NewRun, run_id: str, sealer: Sealer, encoded: bytes | None) -> InsertValues:
    """The row of ``new`` as stored; ``encoded`` is its JSON payload (None: not saved)."""
    return InsertValues(
        id=run_id,
        component_type=new.component_type,
        component_id=new.component_id,
        max_attempts=new.max_attempts,
        priority=new.priority,
        session_id=new.session_id,
        user_id=new.actor.user_id,
        actor=encode_actor(new.actor),
        configuration=new.configuration,
        deployment_id=new.deployment_id or "",
        idempotency_key=new.idempotency_key,
        origin=new.origin,
        delay=max(float(new.delay_seconds), 0.0),
        has_request=new.save_request,
        payload=seal_encoded(sealer, "payload", run_id, encoded),
    )


def insert_values_many(
    news: Sequence[NewRun], run_ids: Sequence[str], sealer: Sealer, encoded: Sequence[bytes | None]
) -> list[InsertValues]:
    """``insert_values`` of a batch: the payloads sealed in one call, the rows built by
    position (a bulk submit builds thousands; keyword construction costs several times more)."""
    kept = [i for i, enc in enumerate(encoded) if enc is not None]
    sealed: list[bytes | None] = [None] * len(news)
    for i, value in zip(
        kept,
        sealer.seal_many("payload", [run_ids[i] for i in kept], [encoded[i] or b"" for i in kept]),
        strict=True,
    ):
        sealed[i] = value
    return [
        InsertValues(
            run_id,
            new.component_type,
            new.component_id,
            new.max_attempts,
            new.priority,
            new.session_id,
            new.actor.user_id,
            encode_actor(new.actor),
            new.configuration,
            new.deployment_id or "",
            new.idempotency_key,
            new.origin,
            max(float(new.delay_seconds), 0.0),
            new.save_request,
            payload,
        )
        for new, run_id, payload in zip(news, run_ids, sealed, strict=True)
    ]


def encoded_payload(new: NewRun) -> bytes | None:
    """The JSON of the payload to store, encoded before any SQL so a bad value writes nothing."""
    return encode_json(new.payload) if new.save_request else None


#: A queued run as a submit writes it, with every per-run column blank: ``fresh_run`` fills
#: in the rest with ``msgspec.structs.replace``, several times cheaper than constructing a
#: 30-field ``Run`` (a bulk submit builds thousands).
_QUEUED_RUN = Run(
    id="",
    component_type="",
    component_id="",
    status=Status.QUEUED,
    attempt=0,
    max_attempts=1,
    priority=0,
    session_id=None,
    user_id=None,
    actor=Actor(),
    configuration=None,
    deployment_id=None,
    idempotency_key=None,
    origin="",
    created_at=0.0,
    updated_at=0.0,
    available_at=0.0,
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


def fresh_run(new: NewRun, values: InsertValues, encoded: bytes | None, now: float) -> Run:
    """The inserted row as a Run, built from what was written (no read-back, no unsealing)."""
    return msgspec.structs.replace(
        _QUEUED_RUN,
        id=values.id,
        component_type=new.component_type,
        component_id=new.component_id,
        max_attempts=new.max_attempts,
        priority=new.priority,
        session_id=new.session_id,
        user_id=new.actor.user_id,
        actor=new.actor,
        configuration=new.configuration,
        deployment_id=new.deployment_id or None,
        idempotency_key=new.idempotency_key,
        origin=new.origin,
        created_at=now,
        updated_at=now,
        available_at=now + values.delay,
        has_request=new.save_request,
        payload=msgspec.json.decode(encoded) if encoded is not None else None,
        concurrency_key=new.concurrency_key,
        timeout_seconds=new.timeout_seconds,
    )


# -- rows coming out --------------------------------------------------------------------


class RowLike(Protocol):
    """What a row must offer: lookup by column name (sqlite3.Row, asyncpg.Record, dict)."""

    def __getitem__(self, key: str, /) -> Any: ...


def row_to_run(row: RowLike, sealer: Sealer) -> Run:
    """A run-table row → an opened ``Run``.

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
        concurrency_key=row["concurrency_key"],
        timeout_seconds=row["timeout_seconds"],
        pause_summary=row["pause_summary"],
    )


def row_to_worker(row: RowLike) -> WorkerInfo:
    return WorkerInfo(
        id=row["id"],
        hostname=row["hostname"],
        pid=row["pid"],
        deployment_id=row["deployment_id"] or None,
        started_at=row["started_at"],
        last_seen_at=row["last_seen_at"],
        settings=decode_settings(row["settings"]),
    )


def encode_settings(settings: dict[str, float]) -> str:
    return _encoder.encode(settings).decode()


def decode_settings(text: str | None) -> dict[str, float]:
    """A worker row's fleet settings; a row written before they were recorded (NULL) or
    holding something else than an object of numbers reads as none recorded."""
    if not text:
        return {}
    try:
        value = _decoder.decode(text)
    except msgspec.DecodeError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in value.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def schedule_state(row: RowLike) -> ScheduleState:
    """A schedules row (either engine) as a ``ScheduleState``."""
    return ScheduleState(
        name=row["name"],
        paused=bool(row["paused"]),
        paused_at=row["paused_at"],
        cursor_at=row["cursor_at"],
        last_slot_at=row["last_slot_at"],
        last_fire_at=row["last_fire_at"],
        last_run_id=row["last_run_id"],
    )


def pause_from_row(row: RowLike) -> Pause:
    """A fleet-wide pause from its row (either engine)."""
    return Pause(
        id=row["id"],
        kind=row["kind"],
        target=row["target"],
        reason=row["reason"],
        created_by=row["created_by"],
        created_at=row["created_at"],
    )


# -- listings ---------------------------------------------------------------------------
