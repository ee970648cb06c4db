"""Engine-neutral row work of the event log: sealing handler data per (run, seq), rows to
``RunEvent``s, and the redaction a settled run's events get at ``[privacy] level =
"redacted"``. Nothing here knows an SQL dialect."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from runq.errors import InvalidPayload
from runq.model import NewEvent, RunEvent
from runq.privacy import cap, redact_value
from runq.seal import Sealer, sealed_key_id

#: A kind is a short name: a handler's own (``progress``, ``delta``...) or a lifecycle one.
KIND_RE = re.compile(r"^[a-z][a-z0-9_.-]{0,31}$")
#: Handler events may not pose as the lifecycle events runq appends itself.
RESERVED_KINDS = frozenset(
    {
        "submitted",
        "claimed",
        "retry_scheduled",
        "paused",
        "continued",
        "requeued",
        "released",
        "reaped",
        "cancel_requested",
        "completed",
        "failed",
        "cancelled",
    }
)
#: The largest encoded ``data`` of one event; a stream is for progress, not bulk data.
MAX_EVENT_BYTES = 64 * 1024

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def check_kind(kind: str) -> str:
    """``kind`` when it is a short lower-case name a handler may use; ``InvalidPayload`` else."""
    if not isinstance(kind, str) or not KIND_RE.match(kind):
        raise InvalidPayload(f"event kind {kind!r} must match {KIND_RE.pattern}")
    if kind in RESERVED_KINDS:
        raise InvalidPayload(f"event kind {kind!r} is reserved for runq's lifecycle events")
    return kind


def new_event(kind: str, data: Any) -> NewEvent:
    """Validate and encode one emitted event (before anything is queued for writing)."""
    check_kind(kind)
    if data is None:
        return NewEvent(kind, None)
    try:
        encoded = _encoder.encode(data)
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as e:
        raise InvalidPayload(f"event data cannot be encoded as JSON: {e}") from e
    if len(encoded) > MAX_EVENT_BYTES:
        raise InvalidPayload(f"event data is {len(encoded)} bytes; at most {MAX_EVENT_BYTES}")
    return NewEvent(kind, encoded)


def column(seq: int) -> str:
    """The sealing column name of one event: binding seq keeps a sealed value from being
    moved to another position (or, with the run id, to another run)."""
    return f"event:{seq}"


def seal_data(sealer: Sealer, run_id: str, seq: int, data: bytes | None) -> bytes | None:
    return None if data is None else sealer.seal(column(seq), run_id, data)


def sealed_batch(
    sealer: Sealer, run_id: str, first_seq: int, events: Sequence[NewEvent]
) -> list[tuple[int, str, bytes | None]]:
    """(seq, kind, sealed data) of a batch numbered from ``first_seq``."""
    return [
        (first_seq + i, e.kind, seal_data(sealer, run_id, first_seq + i, e.data))
        for i, e in enumerate(events)
    ]


def to_event(
    sealer: Sealer,
    run_id: str,
    seq: int,
    attempt: int,
    at: float,
    kind: str,
    info: str | None,
    data: bytes | None,
) -> RunEvent:
    """A stored row as an event: sealed handler data opened, or runq's lifecycle details."""
    value: Any = None
    if data is not None:
        value = _decoder.decode(sealer.open(column(seq), run_id, bytes(data)))
    elif info is not None:
        value = _decoder.decode(info)
    return RunEvent(seq=int(seq), attempt=int(attempt), at=float(at), kind=kind, data=value)


def redacted(
    sealer: Sealer,
    run_id: str,
    stored: Iterable[tuple[int, bytes]],
    max_chars: int,
) -> list[tuple[int, bytes]]:
    """(seq, re-sealed redacted data) for each (seq, sealed data) of a settled run."""
    out: list[tuple[int, bytes]] = []
    for seq, sealed in stored:
        value = _decoder.decode(sealer.open(column(seq), run_id, bytes(sealed)))
        kept = cap(redact_value(value), max_chars)
        out.append((seq, sealer.seal(column(seq), run_id, _encoder.encode(kept))))
    return out


def kept_data(data: bytes | None, level: str | None, max_chars: int) -> bytes | None:
    """An emitted event's encoded data as ``[privacy] level`` keeps it once its run settles
    (``None`` level: as emitted)."""
    if data is None or level is None or level == "full":
        return data
    if level != "redacted":
        return None
    return _encoder.encode(cap(redact_value(_decoder.decode(data)), max_chars))


def settled_batch(
    sealer: Sealer,
    run_id: str,
    first_seq: int,
    events: Sequence[NewEvent],
    level: str | None,
    max_chars: int,
) -> list[tuple[int, str, bytes | None]]:
    """``sealed_batch`` of events written with their run's completion: already cut to the
    level the completion trims to, so nothing written has to be trimmed again."""
    kept = [NewEvent(e.kind, kept_data(e.data, level, max_chars)) for e in events]
    return sealed_batch(sealer, run_id, first_seq, kept)


def resealed_events(
    sealer: Sealer, stored: Iterable[tuple[str, int, bytes]]
) -> list[tuple[str, int, bytes]]:
    """(run id, seq, data re-sealed under the sealing key) for each stored (run id, seq,
    sealed data) that is sealed under another key (key rotation)."""
    out: list[tuple[str, int, bytes]] = []
    for run_id, seq, sealed in stored:
        blob = bytes(sealed)
        if sealed_key_id(blob) == sealer.sealing_key_id:
            continue
        opened = sealer.open(column(seq), run_id, blob)
        out.append((run_id, seq, sealer.seal(column(seq), run_id, opened)))
    return out
