"""Run ids: UUIDv7 strings, so id order is creation order (time-ordered within a process,
and across processes to the millisecond), made without a database round trip."""

from __future__ import annotations

import os
import threading
import time

_last_id_value = 0
_id_lock = threading.Lock()


def new_run_id() -> str:
    """A UUIDv7 string: time-ordered, so ids sort by creation and index pages stay hot.

    Monotonic within a process: ids made in the same millisecond still increase (the
    random bits count up), because "oldest first" ties on equal times break by id.
    """
    return new_run_ids(1)[0]


def new_run_ids(count: int) -> list[str]:
    """``count`` ids as ``new_run_id`` makes them, in increasing order: one clock read, one
    read of the random source and one lock for all of them (a bulk submit makes thousands)."""
    global _last_id_value
    ms = time.time_ns() // 1_000_000
    random = os.urandom(10 * count)
    stamp = ((ms & ((1 << 48) - 1)) << 80) | (0x7 << 76) | (0b10 << 62)
    out: list[str] = []
    with _id_lock:
        last = _last_id_value
        for at in range(0, 10 * count, 10):
            rand = int.from_bytes(random[at : at + 10], "big")
            value = stamp | (((rand >> 62) & 0xFFF) << 64) | (rand & ((1 << 62) - 1))
            if value <= last:
                # Same (or an earlier, if the clock stepped back) millisecond: count up from
                # the last id, skipping the fixed version/variant bits so the id stays a
                # valid UUIDv7.
                value = last + 1
                if (value >> 62) & 0b11 != 0b10:
                    value = ((value >> 64) + 1) << 64 | (0b10 << 62)
            last = value
            h = f"{value:032x}"
            out.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
        _last_id_value = last
    return out
