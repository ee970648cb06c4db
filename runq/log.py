"""Structured logging: one event per line; JSON when not a TTY (or ``--log-format json``).

Every record is an *event* (a short dotted name such as ``run.failed``) plus fields.
Lines about one execution carry ``run_id``, ``attempt`` and ``worker_id``. Payloads,
answers and resume state never reach a log line: callers pass ids and counts only, and
an exception's traceback goes to the log while only its message reaches the run row.

    log = get_logger(__name__)
    log.info("run.completed", run_id=run.id, attempt=run.attempt, worker_id=worker_id)
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from typing import Any, Literal, TextIO

import msgspec

LogFormat = Literal["auto", "json", "text"]

_FIELDS = "runq_fields"
_encoder = msgspec.json.Encoder()

#: How long an INFO line may wait in the buffer, and how much may wait before it is written.
FLUSH_SECONDS = 0.1
FLUSH_BYTES = 64 * 1024


class EventLogger:
    """A thin wrapper over a stdlib logger that takes an event name and keyword fields."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger

    def _log(self, level: int, event: str, exc: bool, fields: dict[str, Any]) -> None:
        logger = self._logger
        if not logger.isEnabledFor(level):
            return
        # The record is made here rather than by ``Logger.log``, which walks the stack for
        # the caller's file and line on every call: no formatter of runq prints them, and
        # at one line per run that walk was most of the logging's cost.
        record = logger.makeRecord(
            logger.name,
            level,
            "",
            0,
            event,
            (),
            sys.exc_info() if exc else None,
            extra={_FIELDS: fields},
        )
        logger.handle(record)

    def debug(self, event: str, **fields: Any) -> None:
        self._log(logging.DEBUG, event, False, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, False, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, False, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, event, False, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """An error with the current exception's traceback (the log, never the run row)."""
        self._log(logging.ERROR, event, True, fields)


def get_logger(name: str) -> EventLogger:
    return EventLogger(logging.getLogger(name))


def _fields_of(record: logging.LogRecord) -> dict[str, Any]:
    fields = getattr(record, _FIELDS, None)
    return dict(fields) if isinstance(fields, dict) else {}


_second: tuple[int, str] = (-1, "")


def _timestamp(record: logging.LogRecord) -> str:
    """ISO 8601 UTC to the millisecond; the formatted second is reused while it lasts."""
    global _second
    whole = int(record.created)
    if _second[0] != whole:
        _second = (whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)))
    return f"{_second[1]}.{int(record.msecs):03d}Z"


def _traceback(record: logging.LogRecord, tracebacks_from: int) -> str | None:
    """The record's traceback when its level shows one (ERROR and worse; everything with
    ``--debug``): a warning is one line an operator reads, not a stack."""
    if not record.exc_info or record.levelno < tracebacks_from:
        return None
    return "".join(traceback.format_exception(*record.exc_info)).rstrip()


def _exception_line(record: logging.LogRecord) -> str | None:
    """What a record's exception says in one line, for a level that shows no traceback."""
    if not record.exc_info or record.exc_info[1] is None:
        return None
    error = record.exc_info[1]
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


class JsonFormatter(logging.Formatter):
    """``{"ts", "level", "logger", "event", ...fields, "exc"?}`` on one line. ``exc``, the
    traceback, only from ``tracebacks_from`` up; below it, the exception's own line is the
    ``error`` field (unless the record has one)."""

    def __init__(self, tracebacks_from: int = logging.ERROR) -> None:
        super().__init__()
        self.tracebacks_from = tracebacks_from

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        line.update(_fields_of(record))
        stack = _traceback(record, self.tracebacks_from)
        if stack is not None:
            line["exc"] = stack
        elif "error" not in line and (summary := _exception_line(record)) is not None:
            line["error"] = summary
        try:
            return _encoder.encode(line).decode()
        except (TypeError, msgspec.EncodeError):
            return _encoder.encode({k: str(v) for k, v in line.items()}).decode()


class TextFormatter(logging.Formatter):
    """``ts LEVEL logger event key=value ...`` for a human at a terminal; tracebacks as
    ``JsonFormatter`` shows them."""

    def __init__(self, tracebacks_from: int = logging.ERROR) -> None:
        super().__init__()
        self.tracebacks_from = tracebacks_from

    def format(self, record: logging.LogRecord) -> str:
        fields = _fields_of(record)
        stack = _traceback(record, self.tracebacks_from)
        if stack is None and "error" not in fields:
            summary = _exception_line(record)
            if summary is not None:
                fields["error"] = summary
        pairs = " ".join(f"{k}={v}" for k, v in fields.items())
        text = f"{_timestamp(record)} {record.levelname:<7} {record.name} {record.getMessage()}"
        if pairs:
            text += " " + pairs
        if stack is not None:
            text += "\n" + stack
        return text


class BatchingStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes lines in batches instead of one write per line.

    At one ``run.completed`` line per run, a write and a flush per line were a tenth of a
    worker's CPU. Lines wait at most ``FLUSH_SECONDS`` (a daemon thread writes them) or
    until ``FLUSH_BYTES`` wait; a WARNING or worse is written at once with everything
    before it, so an error is never held back, and ``logging.shutdown`` (at exit) flushes
    the rest. Order is kept: every line goes through one buffer under the handler's lock.
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._lines: list[str] = []
        self._size = 0
        self._flusher: threading.Thread | None = None

    def emit(self, record: logging.LogRecord) -> None:
        # Called under self.lock (Handler.handle).
        try:
            line = self.format(record)
        except Exception:
            self.handleError(record)
            return
        self._lines.append(line)
        self._size += len(line) + 1
        if record.levelno >= logging.WARNING or self._size >= FLUSH_BYTES:
            self._write()
        elif self._flusher is None:
            self._flusher = threading.Thread(
                target=self._flush_periodically, name="runq-log-flush", daemon=True
            )
            self._flusher.start()

    def flush(self) -> None:
        with self.lock:  # type: ignore[union-attr]  # created by Handler.__init__
            self._write()

    def _write(self) -> None:
        if not self._lines:
            return
        text = "\n".join(self._lines) + "\n"
        self._lines.clear()
        self._size = 0
        try:
            self.stream.write(text)
            self.stream.flush()
        except Exception:  # a closed or broken stderr must not take the caller down
            pass

    def _flush_periodically(self) -> None:
        while True:
            time.sleep(FLUSH_SECONDS)
            self.flush()


def configure_logging(
    fmt: LogFormat = "auto", *, debug: bool = False, level: int = logging.INFO
) -> None:
    """Install one stderr handler on the root logger (replacing earlier ones).
    ``debug`` lowers the level to DEBUG for runq and its libraries alike, and shows the
    traceback of every record that has one (without it, only from ERROR up)."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    handler = BatchingStreamHandler(sys.stderr)
    tracebacks_from = logging.DEBUG if debug else logging.ERROR
    handler.setFormatter(
        JsonFormatter(tracebacks_from) if use_json else TextFormatter(tracebacks_from)
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug else level)
    # Libraries' chatter stays at warnings unless --debug asks for everything.
    for noisy in ("asyncio", "uvicorn.access", "aiosqlite", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if debug else logging.WARNING)
