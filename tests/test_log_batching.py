"""The daemon's stderr handler writes lines in batches: an INFO line reaches the stream
within the flush interval, a WARNING at once together with every line before it, order is
kept, and what waits at exit is written by logging's shutdown."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys

import pytest
from helpers import wait_for_sync

import runq.log
from runq.log import FLUSH_BYTES, BatchingStreamHandler, JsonFormatter, get_logger


def _handler() -> tuple[io.StringIO, logging.Logger]:
    stream = io.StringIO()
    handler = BatchingStreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(f"runq.test.batching.{id(stream)}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    return stream, logger


def _events(stream: io.StringIO) -> list[str]:
    return [json.loads(line)["event"] for line in stream.getvalue().splitlines()]


def test_a_warning_goes_at_once_with_everything_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runq.log, "FLUSH_SECONDS", 3600.0)  # only the warning can write
    stream, logger = _handler()
    log = get_logger(logger.name)
    log.info("first")
    log.info("second")
    assert _events(stream) == []
    log.warning("third")
    assert _events(stream) == ["first", "second", "third"]


def test_an_info_line_is_written_within_the_flush_interval() -> None:
    stream, logger = _handler()
    log = get_logger(logger.name)
    log.info("first")
    wait_for_sync(
        lambda: _events(stream) == ["first"],
        timeout=5,
        message="the INFO line flushed by the handler's thread",
    )


def test_a_full_buffer_is_written_without_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runq.log, "FLUSH_SECONDS", 3600.0)  # only the size can write
    stream, logger = _handler()
    log = get_logger(logger.name)
    filler = "x" * 1000
    count = FLUSH_BYTES // 1000 + 1
    for i in range(count):
        log.info("line", i=i, filler=filler)
    assert len(_events(stream)) >= FLUSH_BYTES // 1100


def test_lines_waiting_at_exit_are_written() -> None:
    code = (
        "import logging, sys\n"
        "from runq.log import configure_logging, get_logger\n"
        "configure_logging('json')\n"
        "log = get_logger('runq.exit')\n"
        "for i in range(100):\n"
        "    log.info('run.completed', i=i)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    lines = [json.loads(line) for line in done.stderr.splitlines()]
    assert [line["i"] for line in lines] == list(range(100))
