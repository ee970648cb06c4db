"""Random and truncated TOML configurations never produce a traceback.

``load_config`` must answer any file, and any ``RUNQ_*`` override, with either a ``Config``
or a ``ConfigError`` that names the key: never another exception (which the CLI could only
report as an unexplained one-liner, or a daemon as a traceback). Three generators feed it:

* every truncation of ``config.example.toml`` (a file cut short by a full disk or an
  editor crash), a byte apart around every line and sampled in between;
* the example with random bytes replaced, inserted or deleted (an edit gone wrong);
* structurally valid TOML whose known sections and keys hold values of every TOML type,
  nested tables and arrays of tables (a wrong type where a number belongs);
* the environment overrides with random text.

A sample of them also goes through ``runq serve --config`` and ``runq status --config``
as subprocesses: exit code 2 and one line on stderr naming the problem, no traceback.
The ``long`` variant runs twenty times as many examples.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runq.config import Config, load_config
from runq.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = (REPO / "config.example.toml").read_text(encoding="utf-8")
SHORT_EXAMPLES = 300
LONG_EXAMPLES = 6000

#: Every section and key the config knows, so the structured generator hits real fields.
SECTIONS: dict[str, list[str]] = {
    "store": ["url", "schema"],
    "queue": [
        "max_attempts",
        "retry_delay_seconds",
        "timeout_seconds",
        "lock_grace_seconds",
        "stop_timeout_seconds",
        "poll_interval",
        "max_concurrency",
        "max_queue_depth",
        "retention_seconds",
        "paused_retention_seconds",
        "retention_interval_seconds",
        "deployment_id",
        "serialize_sessions",
        "worker",
    ],
    "reaper": ["limit"],
    "http": ["listen", "auth", "allow_open_on_public", "key", "max_body_bytes", "jwt"],
    "seal": ["keys"],
    "cli": ["service_account"],
    "budget": ["timezone", "limits"],
    "privacy": ["level", "redacted_max_chars"],
    "routing": ["*", "task/*", "agent/x"],
    "components": ["task/x", "agent/y", "nope"],
}
ENV_NAMES = [
    f"RUNQ_{section}_{key}".upper()
    for section, keys in SECTIONS.items()
    if section not in ("routing", "components")
    for key in keys
] + ["RUNQ_HTTP_JWT_SECRET", "RUNQ_HTTP_JWT_ALGORITHMS", "RUNQ_HTTP_JWT_LEEWAY_SECONDS"]


def check_load(path: Path, environ: dict[str, str] | None = None) -> Config | ConfigError:
    try:
        return load_config(path, environ=environ or {})
    except ConfigError as e:
        error = e
    assert str(error), "a ConfigError without a message"
    return error
    # Anything else propagates: the test fails with the traceback it would have shown.


# -- generators ----------------------------------------------------------------------------------

toml_keys = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_*/.-", min_size=1, max_size=12)
scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=40),
    st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31)),
    st.dates(),
    st.times(),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(toml_keys, inner, max_size=4)
    ),
    max_leaves=8,
)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return "nan"
        if value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return '"' + value.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f'"{k}" = {toml_value(v)}' for k, v in value.items()) + "}"
    raise TypeError(type(value))


@st.composite
def structured_configs(draw: st.DrawFn) -> str:
    lines: list[str] = []
    for section in draw(st.lists(st.sampled_from(list(SECTIONS)), max_size=4, unique=True)):
        form = draw(st.sampled_from(["table", "scalar", "array_of_tables"]))
        if form == "scalar":
            lines.append(f"{section} = {toml_value(draw(values))}")
            continue
        keys = draw(st.lists(st.sampled_from(SECTIONS[section]) | toml_keys, max_size=5))
        entries = {f'"{k}"': toml_value(draw(values)) for k in keys}
        header = f"[[{section}]]" if form == "array_of_tables" else f"[{section}]"
        lines.append(header)
        lines.extend(f"{k} = {v}" for k, v in entries.items())
    return "\n".join(lines) + "\n"


@st.composite
def mutated_examples(draw: st.DrawFn) -> str:
    text = EXAMPLE
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        at = draw(st.integers(min_value=0, max_value=len(text)))
        junk = draw(st.text(alphabet="[]{}=\".,#\n 0123456789abcxyz_-:/\\'", max_size=6))
        cut = draw(st.integers(min_value=0, max_value=8))
        text = text[:at] + junk + text[at + cut :]
    return text


def truncations() -> list[int]:
    offsets = set(range(0, len(EXAMPLE), 11))
    at = 0
    for line in EXAMPLE.splitlines(keepends=True):
        at += len(line)
        offsets.update(range(max(at - 3, 0), min(at + 3, len(EXAMPLE))))
    return sorted(offsets)


def run_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )


VARIANTS = [
    pytest.param(SHORT_EXAMPLES, id="short"),
    pytest.param(LONG_EXAMPLES, id="long", marks=pytest.mark.long),
]


# -- the properties --------------------------------------------------------------------------------


def test_every_truncation_of_the_example_loads_or_names_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "cut.toml"
    outcomes = {"loaded": 0, "refused": 0}
    for offset in truncations():
        path.write_text(EXAMPLE[:offset], encoding="utf-8")
        result = check_load(path)
        outcomes["loaded" if isinstance(result, Config) else "refused"] += 1
    # Cut at a line end the example is still a valid, partial file.
    assert outcomes["loaded"] > 0, outcomes
    assert outcomes["refused"] > 0, outcomes


@pytest.mark.parametrize("examples", VARIANTS)
def test_mutated_examples_load_or_name_the_problem(examples: int, tmp_path: Path) -> None:
    path = tmp_path / "mutated.toml"

    @run_settings(examples)
    @given(text=mutated_examples())
    def prop(text: str) -> None:
        path.write_text(text, encoding="utf-8")
        check_load(path)

    prop()


@pytest.mark.parametrize("examples", VARIANTS)
def test_random_values_in_known_keys_load_or_name_the_key(examples: int, tmp_path: Path) -> None:
    path = tmp_path / "random.toml"

    @run_settings(examples)
    @given(text=structured_configs())
    def prop(text: str) -> None:
        path.write_text(text, encoding="utf-8")
        check_load(path)

    prop()


@pytest.mark.parametrize("examples", VARIANTS)
def test_random_environment_overrides_load_or_name_the_key(examples: int, tmp_path: Path) -> None:
    path = tmp_path / "base.toml"
    path.write_text(EXAMPLE, encoding="utf-8")

    @run_settings(examples)
    @given(env=st.dictionaries(st.sampled_from(ENV_NAMES), st.text(max_size=30), max_size=4))
    def prop(env: dict[str, str]) -> None:
        check_load(path, env)

    prop()


def test_random_bytes_are_refused_as_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "bytes.toml"

    @run_settings(SHORT_EXAMPLES)
    @given(data=st.binary(max_size=200))
    def prop(data: bytes) -> None:
        path.write_bytes(data)
        check_load(path)

    prop()


# -- through the CLI -------------------------------------------------------------------------------

BAD_FILES = {
    "truncated": EXAMPLE[: EXAMPLE.index("[http]") + 20],
    "binary": "\x00\x01\x02 not toml \xff",
    "wrong type": '[queue]\nmax_attempts = "three"\n',
    "a date for a number": "[queue]\npoll_interval = 2026-11-30\n",
    "a section as a scalar": "queue = 5\n",
    "limits as a number": "[budget]\nlimits = 5\n",
    "limits of numbers": "[budget]\nlimits = [1, 2]\n",
    "nested junk": "[http]\njwt = [1, 2]\n",
    "routing table": '[routing]\n"*" = { a = 1 }\n',
    "component list": '[components]\n"task/x" = [1]\n',
    "component table without kind": '[components]\n"task/x" = { url = 5 }\n',
    "listen nonsense": '[http]\nlisten = "::::"\n',
    "huge integer": "[queue]\nmax_concurrency = 9223372036854775807\n",
    "inf": "[queue]\nlock_grace_seconds = inf\n",
    "nan": "[queue]\npoll_interval = nan\n",
}


CLI_CASES = [(["serve"], name) for name in sorted(BAD_FILES)] + [
    (["status"], name) for name in ("truncated", "limits as a number", "inf")
]


@pytest.mark.parametrize(("command", "name"), CLI_CASES, ids=[f"{c[0]}-{n}" for c, n in CLI_CASES])
def test_the_cli_answers_a_bad_config_with_one_line(
    command: list[str], name: str, tmp_path: Path
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(BAD_FILES[name], encoding="utf-8", errors="surrogateescape")
    result = subprocess.run(
        [sys.executable, "-m", "runq", *command, "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("runq: configuration error"), result.stderr
