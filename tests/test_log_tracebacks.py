"""A warning is one line: no traceback below ERROR unless ``--debug``, and asyncpg's
"Failed to restore the pool connection floor" warnings (one a second per pool while the
database is away, each with a traceback) become one debug line of runq's."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from runq.log import JsonFormatter, TextFormatter
from runq.store.postgres.connection import quiet_pool_floor_warnings


def _record(level: int) -> logging.LogRecord:
    try:
        raise ConnectionRefusedError("connection refused")
    except ConnectionRefusedError:
        info = sys.exc_info()
    return logging.LogRecord("asyncpg.pool", level, "", 0, "something failed", (), info)


@pytest.mark.parametrize("formatter", [JsonFormatter, TextFormatter])
def test_a_warning_shows_its_exception_in_one_line_and_an_error_its_traceback(
    formatter: type[JsonFormatter] | type[TextFormatter],
) -> None:
    quiet = formatter()
    warning = quiet.format(_record(logging.WARNING))
    assert "Traceback" not in warning
    assert "\n" not in warning
    assert "ConnectionRefusedError: connection refused" in warning
    assert "Traceback" in quiet.format(_record(logging.ERROR))
    # --debug: every traceback.
    assert "Traceback" in formatter(logging.DEBUG).format(_record(logging.WARNING))


def test_the_json_line_of_a_warning_keeps_its_own_error_field() -> None:
    record = _record(logging.WARNING)
    record.runq_fields = {"error": "the caller's words"}
    line = json.loads(JsonFormatter().format(record))
    assert line["error"] == "the caller's words"
    assert "exc" not in line


def test_asyncpg_pool_floor_warnings_become_one_debug_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    quiet_pool_floor_warnings()
    quiet_pool_floor_warnings()  # idempotent: one filter
    pool_logger = logging.getLogger("asyncpg.pool")
    assert len(pool_logger.filters) == 1
    caplog.set_level(logging.DEBUG)
    try:
        raise OSError("connection refused")
    except OSError:
        pool_logger.warning("Failed to restore the pool connection floor; retrying", exc_info=True)
    pool_logger.warning("Pool.close() is taking over 60 seconds to complete.")
    records = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert ("runq.store.postgres.connection", logging.DEBUG, "store.pool_reconnect_failed") in (
        records
    )
    assert [m for name, _, m in records if name == "asyncpg.pool"] == [
        "Pool.close() is taking over 60 seconds to complete."
    ]
