"""packaging/: the systemd unit, the container image, the alert rules and the dashboard.

Nothing here starts a daemon. The files are checked with the tools that consume them
where the machine has them (``systemd-analyze``, ``systemd-sysusers``,
``systemd-tmpfiles``, ``promtool``) and parsed otherwise. promtool is required under
``CI=true`` (CI installs it with ``packaging/ci-install-promtool.sh``); elsewhere its
tests skip with the reason. Every PromQL expression, in the rules and the dashboard, may
only name metrics that ``runq/metrics.py`` registers.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from runq import metrics
from runq.config import QueueConfig, load_config
from runq.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"
UNIT = PACKAGING / "systemd" / "runq.service"
SYSUSERS = PACKAGING / "systemd" / "runq.sysusers"
TMPFILES = PACKAGING / "systemd" / "runq.tmpfiles"
UNIT_TOML = PACKAGING / "systemd" / "runq.toml"
CONTAINERFILE = PACKAGING / "container" / "Containerfile"
COMPOSE = PACKAGING / "container" / "compose.sidecar.yaml"
PROBE = PACKAGING / "container" / "runq_probe.py"
BUILD_IMAGE = PACKAGING / "container" / "build-image"
ALERTS = PACKAGING / "prometheus" / "runq-alerts.yml"
ALERT_TESTS = PACKAGING / "prometheus" / "runq-alerts.test.yml"
DASHBOARD = PACKAGING / "grafana" / "runq-dashboard.json"
INSTALL_PROMTOOL = PACKAGING / "ci-install-promtool.sh"
OPERATIONS = ROOT / "docs" / "operations.md"

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
TOOL_TIMEOUT = 60


def require_promtool() -> str:
    # scripts/test extracts promtool into the project's environment, beside its python.
    path = shutil.which("promtool") or shutil.which(
        "promtool", path=str(Path(sys.executable).parent)
    )
    if path is None:
        reason = "promtool is not installed (run packaging/ci-install-promtool.sh)"
        if IN_CI:
            pytest.fail(f"{reason}; CI=true: the alerting-rule tests must run")
        pytest.skip(reason)
    return path


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed; the file checks without it still run")
    return path


def run_tool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        cwd=cwd,
        check=False,
    )


# --- metric names ---------------------------------------------------------------------

_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
}


def exported_metric_names() -> set[str]:
    """Every series name a runq process exports, from the registry in runq/metrics.py."""
    names: set[str] = set()
    for family in metrics.REGISTRY.collect():
        for suffix in _SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names


def runq_metric_families() -> set[str]:
    """The metrics runq itself defines (not the process/platform collectors)."""
    return {f.name for f in metrics.REGISTRY.collect() if f.name.startswith("runq_")}


#: PromQL keywords, aggregations and functions: every other bare word is a metric name.
_PROMQL_VOCABULARY = """
    sum min max avg group stddev stdvar count count_values bottomk topk quantile
    by without on ignoring group_left group_right bool and or unless offset
    abs absent absent_over_time ceil changes clamp clamp_max clamp_min day_of_month
    day_of_week day_of_year days_in_month delta deriv exp floor histogram_count
    histogram_sum histogram_fraction histogram_quantile holt_winters hour idelta increase
    irate label_join label_replace ln log2 log10 minute month predict_linear rate resets
    round scalar sgn sort sort_desc sqrt time timestamp vector year
    avg_over_time min_over_time max_over_time sum_over_time count_over_time
    quantile_over_time stddev_over_time stdvar_over_time last_over_time present_over_time
    inf nan
"""
_PROMQL_WORDS = frozenset(_PROMQL_VOCABULARY.split())


def metric_names_in(expr: str) -> set[str]:
    """The metric names an expression selects (a small lexer, not a PromQL parser)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'', '""', expr)  # string literals
    text = re.sub(r"\$\{[^}]*\}|\$\w+", "", text)  # Grafana variables
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text
    )  # label lists
    text = re.sub(r"\boffset\s+\d+\w*", "", text)
    names = set()
    for token in re.findall(r"(?<![\w.])[A-Za-z_:][\w:]*", text):
        if token not in _PROMQL_WORDS:
            names.add(token)
    return names


def unknown_metrics(expr: str) -> set[str]:
    return metric_names_in(expr) - exported_metric_names()


def test_metric_checker_reads_the_registry() -> None:
    names = exported_metric_names()
    assert "runq_runs_finished_total" in names
    assert "runq_queue_wait_seconds_bucket" in names
    assert "runq_live_workers" in names
    assert "runq_runs_finished" not in names  # a counter is exported with _total


def test_metric_checker_catches_unknown_names() -> None:
    """The check the rules and dashboard rely on can fail."""
    assert unknown_metrics("sum(rate(runq_claims_total[5m]))") == set()
    assert unknown_metrics("sum(rate(runq_claim_total[5m]))") == {"runq_claim_total"}
    assert unknown_metrics('runq_runs{status="failed"} > runq_jobs') == {"runq_jobs"}
    assert unknown_metrics(
        "histogram_quantile(0.9, sum by (le, outcome) (rate(runq_run_duration_seconds[5m])))"
    ) == {"runq_run_duration_seconds"}
    assert unknown_metrics('max by (job) (runq_expired_leases{job=~"$job"}) > 0') == set()


# --- systemd ----------------------------------------------------------------------------


def parse_unit(path: Path) -> list[tuple[str, str, str]]:
    """(section, key, value) in file order; keys may repeat, as systemd allows."""
    entries: list[tuple[str, str, str]] = []
    section = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not 'Key=value': {raw!r}"
        entries.append((section, key.strip(), value.strip()))
    return entries


def unit_values(section: str, key: str) -> list[str]:
    return [v for s, k, v in parse_unit(UNIT) if s == section and k == key]


def unit_value(section: str, key: str) -> str:
    values = unit_values(section, key)
    assert values, f"[{section}] {key}= is missing from {UNIT.name}"
    return values[-1]


_TIMESPAN_UNITS = {
    "": 1.0,
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "ms": 0.001,
    "msec": 0.001,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
}


def timespan_seconds(text: str) -> float:
    """A systemd time span ("45", "45s", "1min 30s") in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text.strip())
    assert parts, f"not a time span: {text!r}"
    return sum(float(n) * _TIMESPAN_UNITS[u] for n, u in parts)


REQUIRED_SERVICE = {
    "Type": "notify",
    "NotifyAccess": "main",
    "KillSignal": "SIGTERM",
    "Restart": "on-failure",
    "RestartPreventExitStatus": "2",
    "User": "runq",
    "Group": "runq",
    "StateDirectory": "runq",
    "WorkingDirectory": "/var/lib/runq",
    "ReadWritePaths": "/var/lib/runq",
    "UMask": "0077",
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "RestrictNamespaces": "yes",
    "LockPersonality": "yes",
    "MemoryDenyWriteExecute": "yes",
    "SystemCallArchitectures": "native",
    "CapabilityBoundingSet": "",
}


@pytest.mark.parametrize(("key", "expected"), sorted(REQUIRED_SERVICE.items()))
def test_unit_sets(key: str, expected: str) -> None:
    assert unit_value("Service", key) == expected


def test_unit_runs_serve_with_the_config_it_exports() -> None:
    argv = shlex.split(unit_value("Service", "ExecStart"))
    assert Path(argv[0]).name == "runq"
    assert argv[1] == "serve"
    config = argv[argv.index("--config") + 1]
    assert config == "/etc/runq/runq.toml"
    assert f"RUNQ_CONFIG={config}" in unit_values("Service", "Environment")
    assert "@system-service" in unit_values("Service", "SystemCallFilter")
    assert unit_value("Install", "WantedBy") == "multi-user.target"


def test_unit_timers() -> None:
    assert timespan_seconds(unit_value("Service", "WatchdogSec")) == 30
    assert timespan_seconds(unit_value("Service", "RestartSec")) == 2


def test_stop_timeout_leaves_room_for_the_drain() -> None:
    """systemd must not SIGKILL runq while it drains: TimeoutStopSec > stop timeout."""
    stop = timespan_seconds(unit_value("Service", "TimeoutStopSec"))
    assert stop == 45
    default_drain = QueueConfig().effective_stop_timeout
    assert stop > default_drain
    shipped = load_config(UNIT_TOML, environ={}).queue.effective_stop_timeout
    # Settling stragglers and closing HTTP happen after the drain: keep a margin.
    assert stop >= shipped + 10


def test_unit_toml_is_a_valid_production_config() -> None:
    config = load_config(UNIT_TOML, environ={})
    assert config.store.url == "sqlite:////var/lib/runq/runq.db"
    db = Path(config.store.url.removeprefix("sqlite:///"))
    assert db.parent == Path(unit_value("Service", "WorkingDirectory"))
    assert config.queue.effective_stop_timeout < config.queue.lock_grace_seconds
    assert config.http.auth != "open"


def installed_root(root: Path) -> Path:
    """A scratch root with the unit, its companions and the config installed where the
    documented install block puts them, and an executable where that block's virtualenv
    puts ``runq`` (verify insists that ExecStart's program exists)."""
    units = root / "usr" / "lib" / "systemd" / "system"
    shutil.copytree("/usr/lib/systemd/system", units, symlinks=True)  # sysinit.target...
    placed = {
        UNIT: "etc/systemd/system/runq.service",
        SYSUSERS: "etc/sysusers.d/runq.conf",
        TMPFILES: "etc/tmpfiles.d/runq.conf",
        UNIT_TOML: "etc/runq/runq.toml",
    }
    for source, target in placed.items():
        (root / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, root / target)
    (root / "etc/runq/runq.env").write_text("RUNQ_API_KEY=x\n", encoding="utf-8")
    program = root / shlex.split(unit_value("Service", "ExecStart"))[0].lstrip("/")
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    program.chmod(0o755)
    return root


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    tool = require_tool("systemd-analyze")
    if not Path("/usr/lib/systemd/system/sysinit.target").exists():
        pytest.skip("no systemd unit directory to verify against")
    root = installed_root(tmp_path / "root")
    result = run_tool(
        tool,
        "verify",
        f"--root={root}",
        "--man=no",
        "--generators=no",
        "/etc/systemd/system/runq.service",
    )
    # Unknown keys and unparsable values are only warnings (exit 0): fail on them too.
    complaints = [
        line for line in (result.stdout + result.stderr).splitlines() if "runq.service" in line
    ]
    assert result.returncode == 0, result.stdout + result.stderr
    assert complaints == []


def test_systemd_analyze_verify_fails_without_the_program(tmp_path: Path) -> None:
    """The check above can fail: the unit's ExecStart must exist in the installed root."""
    tool = require_tool("systemd-analyze")
    if not Path("/usr/lib/systemd/system/sysinit.target").exists():
        pytest.skip("no systemd unit directory to verify against")
    root = installed_root(tmp_path / "root")
    (root / "opt").rename(root / "elsewhere")
    result = run_tool(
        tool,
        "verify",
        f"--root={root}",
        "--man=no",
        "--generators=no",
        "/etc/systemd/system/runq.service",
    )
    assert result.returncode != 0
    assert "is not executable" in result.stdout + result.stderr


def test_systemd_analyze_security(tmp_path: Path) -> None:
    tool = require_tool("systemd-analyze")
    unit = tmp_path / "runq.service"
    shutil.copy(UNIT, unit)
    # --threshold is the exposure level x10: fail above 2.0 ("OK" is below 4).
    result = run_tool(tool, "security", "--offline=true", "--man=no", "--threshold=20", unit)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr


def test_sysusers_creates_the_runq_user(tmp_path: Path) -> None:
    assert SYSUSERS.read_text(encoding="utf-8").splitlines()[-1] == (
        'u runq - "runq queue daemon" /var/lib/runq'
    )
    tool = require_tool("systemd-sysusers")
    (tmp_path / "etc").mkdir()
    result = run_tool(tool, f"--root={tmp_path}", SYSUSERS)
    assert result.returncode == 0, result.stderr
    passwd = (tmp_path / "etc" / "passwd").read_text(encoding="utf-8")
    fields = next(line for line in passwd.splitlines() if line.startswith("runq:")).split(":")
    assert fields[5] == "/var/lib/runq"
    assert int(fields[2]) != 0


def test_tmpfiles_creates_a_private_state_directory(tmp_path: Path) -> None:
    assert TMPFILES.read_text(encoding="utf-8").splitlines()[-1].split() == [
        "d",
        "/var/lib/runq",
        "0750",
        "runq",
        "runq",
        "-",
    ]
    sysusers = require_tool("systemd-sysusers")
    tmpfiles = require_tool("systemd-tmpfiles")
    (tmp_path / "etc").mkdir()
    assert run_tool(sysusers, f"--root={tmp_path}", SYSUSERS).returncode == 0
    result = run_tool(tmpfiles, f"--root={tmp_path}", "--create", TMPFILES)
    assert result.returncode == 0, result.stderr
    state = tmp_path / "var" / "lib" / "runq"
    assert state.is_dir()
    assert state.stat().st_mode & 0o777 == 0o750


# --- container --------------------------------------------------------------------------


def containerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in CONTAINERFILE.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    assert not pending, "Containerfile ends inside a continued line"
    out = []
    for line in logical:
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def final_stage() -> list[tuple[str, str]]:
    instructions = containerfile_instructions()
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last_from:]


def container_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in final_stage():
        if word == "ENV":
            for item in shlex.split(rest):
                key, sep, value = item.partition("=")
                assert sep, f"ENV without '=': {item!r} (use ENV KEY=value)"
                env[key] = value
    return env


def exec_form(instruction: str) -> list[str]:
    args = [rest for word, rest in final_stage() if word == instruction]
    assert args, f"{instruction} missing from the final stage"
    value = json.loads(args[-1])
    assert isinstance(value, list)
    return [str(v) for v in value]


def healthcheck_argv() -> list[str]:
    checks = [rest for word, rest in final_stage() if word == "HEALTHCHECK"]
    assert len(checks) == 1, "one HEALTHCHECK in the final stage"
    _, cmd, form = checks[0].partition("CMD ")
    assert cmd, "HEALTHCHECK needs a CMD"
    argv = json.loads(form)
    assert isinstance(argv, list)
    return [str(a) for a in argv]


def test_container_installs_from_the_wheelhouse_only() -> None:
    instructions = containerfile_instructions()
    assert ("ARG", "BASE_IMAGE=localhost/runq-base:bookworm") in instructions
    froms = [rest for w, rest in instructions if w == "FROM"]
    assert froms == ["${BASE_IMAGE} AS install", "${BASE_IMAGE}"]
    runs = " ".join(rest for w, rest in instructions if w == "RUN")
    assert "pip install --no-index --find-links=/wheels" in runs
    assert ("COPY", "wheels /wheels") in instructions
    # The runtime stage takes the virtualenv, never the wheels.
    copies = [rest for w, rest in final_stage() if w == "COPY"]
    assert "--from=install /opt/runq /opt/runq" in copies
    assert not any("wheels" in rest for rest in copies)
    # build-image builds with no network inside the build.
    assert "build --network=none" in BUILD_IMAGE.read_text(encoding="utf-8")


def test_container_runs_as_a_non_root_user() -> None:
    users = [rest for word, rest in final_stage() if word == "USER"]
    assert users, "the final stage must set USER"
    user, _, group = users[-1].partition(":")
    assert user not in ("", "0", "root")
    assert group not in ("0", "root")
    assert user == "10001"
    # Nothing after USER switches back to root.
    after = final_stage()[[w for w, _ in final_stage()].index("USER") :]
    assert all(rest.split(":")[0] not in ("0", "root") for w, rest in after if w == "USER")
    assert "useradd --uid 10001 --gid 10001" in CONTAINERFILE.read_text(encoding="utf-8")


def test_container_interface() -> None:
    stage = final_stage()
    assert ("EXPOSE", "7777") in stage
    assert ("STOPSIGNAL", "SIGTERM") in stage
    assert ("WORKDIR", "/var/lib/runq") in stage
    assert json.loads(next(rest for w, rest in stage if w == "VOLUME")) == ["/var/lib/runq"]
    assert exec_form("ENTRYPOINT") == ["runq"]
    assert exec_form("CMD") == ["serve"]


def test_container_healthcheck_probes_readyz_without_curl() -> None:
    assert healthcheck_argv() == ["runq-probe", "/readyz"]
    assert "runq_probe.py /usr/local/bin/runq-probe" in CONTAINERFILE.read_text(encoding="utf-8")
    assert "curl" not in PROBE.read_text(encoding="utf-8").split('"""', 2)[2]


def test_container_environment_is_a_config_runq_accepts() -> None:
    env = container_env()
    assert env["RUNQ_HTTP_LISTEN"] == "0.0.0.0:7777"
    assert env["RUNQ_HTTP_AUTH"] == "key"
    assert env["RUNQ_HTTP_KEY"] == "env:RUNQ_API_KEY"
    assert "RUNQ_API_KEY" not in env, "the API key is a run-time secret, not an image default"
    config = load_config(environ={**env, "RUNQ_API_KEY": "k" * 32})
    assert config.http.host_port == ("0.0.0.0", 7777)
    assert config.store.url == "sqlite:////var/lib/runq/runq.db"
    # Why the image sets auth: open auth on 0.0.0.0 is refused.
    without_auth = {k: v for k, v in env.items() if k != "RUNQ_HTTP_AUTH"}
    with pytest.raises(ConfigError, match=r"http\.auth"):
        load_config(environ=without_auth)


class _Readyz(http.server.BaseHTTPRequestHandler):
    status = 200
    paths: list[str] = []

    def do_GET(self) -> None:
        type(self).paths.append(self.path)
        code = self.status if self.path == "/readyz" else 404
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def readyz_server() -> Iterator[tuple[int, type[_Readyz]]]:
    handler = type("Handler", (_Readyz,), {"status": 200, "paths": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _run_healthcheck(port: int) -> int:
    """The image's HEALTHCHECK command (runq-probe), with this interpreter, against
    127.0.0.1:port."""
    argv = healthcheck_argv()
    env = {"PATH": os.environ.get("PATH", ""), "RUNQ_HTTP_LISTEN": f"0.0.0.0:{port}"}
    done = subprocess.run(
        [sys.executable, PROBE, *argv[1:]], env=env, capture_output=True, timeout=30, check=False
    )
    return done.returncode


def test_container_healthcheck_command_follows_readyz(
    readyz_server: tuple[int, type[_Readyz]],
) -> None:
    port, handler = readyz_server
    assert _run_healthcheck(port) == 0
    assert handler.paths == ["/readyz"]
    handler.status = 503
    assert _run_healthcheck(port) != 0


def test_container_healthcheck_fails_when_nothing_listens() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    # Released: nothing listens there now.
    assert _run_healthcheck(closed) != 0


def test_compose_sidecar() -> None:
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    services = compose["services"]
    runq, app = services["runq"], services["app"]
    assert app["environment"]["RUNQ_URL"] == "http://runq:7777"
    assert "RUNQ_API_KEY" in app["environment"]
    assert "RUNQ_API_KEY" in runq["environment"]
    assert app["depends_on"]["runq"]["condition"] == "service_healthy"
    assert runq["image"] == "localhost/runq:latest"  # build-image's default tag
    assert "localhost/runq:latest" in BUILD_IMAGE.read_text(encoding="utf-8")
    grace = timespan_seconds(runq["stop_grace_period"])
    assert grace > QueueConfig().effective_stop_timeout
    volumes = runq["volumes"]
    assert any(v.endswith(":/var/lib/runq") for v in volumes)
    mounted = next(v for v in volumes if v.endswith(":/etc/runq/runq.toml:ro"))
    config_file = COMPOSE.parent / mounted.split(":", 1)[0]
    env = {**container_env(), "RUNQ_API_KEY": "k" * 32}
    config = load_config(config_file, environ=env)
    assert config.http.auth == "key"
    assert config.queue.effective_stop_timeout < grace


# --- Prometheus -------------------------------------------------------------------------


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_promtool_check_rules() -> None:
    promtool = require_promtool()
    result = run_tool(promtool, "check", "rules", ALERTS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests() -> None:
    promtool = require_promtool()
    result = run_tool(promtool, "test", "rules", ALERT_TESTS.name, cwd=ALERT_TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_catch_a_wrong_threshold(tmp_path: Path) -> None:
    """The unit tests are not vacuous: a rule with a wrong threshold fails them."""
    promtool = require_promtool()
    rules = ALERTS.read_text(encoding="utf-8")
    broken = rules.replace(
        "(runq_oldest_queued_age_seconds) > 300", "(runq_oldest_queued_age_seconds) > 3000"
    )
    assert broken != rules
    (tmp_path / ALERTS.name).write_text(broken, encoding="utf-8")
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    result = run_tool(promtool, "test", "rules", ALERT_TESTS.name, cwd=tmp_path)
    assert result.returncode != 0
    assert "RunqQueueWaitHigh" in result.stdout + result.stderr


REQUIRED_ALERTS = {
    "RunqQueueWaitHigh": "warning",
    "RunqQueueWaitCritical": "critical",
    "RunqReaperDeadLettered": "warning",
    "RunqDeadLetterBacklogGrowing": "warning",
    "RunqExpiredLeases": "warning",
    "RunqNoLiveWorkers": "critical",
    "RunqMetricsAbsent": "critical",
}


def test_alerts_present_with_severity_and_guidance() -> None:
    rules = {r["alert"]: r for r in alert_rules()}
    for name, severity in REQUIRED_ALERTS.items():
        assert name in rules, f"alert {name} missing"
        assert rules[name]["labels"]["severity"] == severity
    for rule in rules.values():
        assert rule["labels"]["severity"] in ("warning", "critical")
        annotations = rule["annotations"]
        assert annotations["summary"].strip()
        assert len(annotations["description"]) > 80, f"{rule['alert']}: say what to check"


def test_alert_thresholds() -> None:
    rules = {r["alert"]: r for r in alert_rules()}
    assert rules["RunqQueueWaitHigh"]["expr"].endswith("> 300")
    assert rules["RunqQueueWaitHigh"]["for"] == "5m"
    assert rules["RunqQueueWaitCritical"]["expr"].endswith("> 900")
    assert rules["RunqExpiredLeases"]["for"] == "5m"
    assert rules["RunqNoLiveWorkers"]["expr"].endswith("< 1")
    assert rules["RunqNoLiveWorkers"]["for"] == "2m"
    assert rules["RunqMetricsAbsent"]["expr"] == "absent(runq_live_workers)"
    assert (
        "increase(runq_reaper_dead_lettered_total[15m])" in rules["RunqReaperDeadLettered"]["expr"]
    )
    text = " ".join(r["annotations"]["description"] for r in rules.values())
    for hint in ("affinity", "capacity", "/queue/jobs?status=failed", "runq jobs requeue"):
        assert hint in text


def test_every_alert_is_tested_firing_and_quiet() -> None:
    doc = yaml.safe_load(ALERT_TESTS.read_text(encoding="utf-8"))
    firing: set[str] = set()
    quiet: set[str] = set()
    for test in doc["tests"]:
        for case in test["alert_rule_test"]:
            (firing if case["exp_alerts"] else quiet).add(case["alertname"])
    names = {r["alert"] for r in alert_rules()}
    assert names - firing == set(), "alerts never shown to fire"
    assert names - quiet == set(), "alerts never shown to stay quiet"


def test_alert_rules_use_only_exported_metrics() -> None:
    for rule in alert_rules():
        assert unknown_metrics(rule["expr"]) == set(), rule["alert"]


def test_every_alert_is_documented() -> None:
    text = OPERATIONS.read_text(encoding="utf-8")
    for rule in alert_rules():
        assert f"`{rule['alert']}`" in text, f"docs/operations.md does not explain {rule['alert']}"


def test_install_promtool_script() -> None:
    assert run_tool("bash", "-n", INSTALL_PROMTOOL).returncode == 0
    text = INSTALL_PROMTOOL.read_text(encoding="utf-8")
    assert "command -v promtool" in text
    if shutil.which("promtool") is not None:
        # Idempotent: with promtool present it installs nothing and succeeds.
        result = run_tool("bash", INSTALL_PROMTOOL)
        assert result.returncode == 0, result.stderr
        assert "promtool present" in result.stdout


# --- Grafana ----------------------------------------------------------------------------


def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def dashboard_panels() -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    for panel in dashboard()["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return panels


def dashboard_exprs() -> list[tuple[str, str]]:
    return [
        (panel["title"], target["expr"])
        for panel in dashboard_panels()
        for target in panel.get("targets", [])
    ]


REQUIRED_PANELS = (
    "Runs by status",
    "Oldest queued age by deployment",
    "Queue wait p50 / p95 / p99",
    "Run duration by outcome (p50 / p95)",
    "Runs finished by outcome",
    "Claims and submissions per second",
    "Reaper requeues and dead letters",
    "Leases lost",
    "Fenced writes",
    "Budget refusals",
    "Live workers",
    "In flight vs concurrency limit",
    "Event loop lag",
    "Resident memory",
)


def test_dashboard_shape() -> None:
    data = dashboard()
    assert 36 <= data["schemaVersion"] <= 41
    assert data["uid"]
    assert data["title"]
    variables = {v["name"]: v for v in data["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    panels = dashboard_panels()
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    titles = {p["title"] for p in panels}
    assert set(REQUIRED_PANELS) <= titles
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]


def test_dashboard_queue_wait_quantiles() -> None:
    panel = next(p for p in dashboard_panels() if p["title"] == "Queue wait p50 / p95 / p99")
    exprs = [t["expr"] for t in panel["targets"]]
    for q in ("0.5", "0.95", "0.99"):
        assert any(
            e.startswith(f"histogram_quantile({q},") and "runq_queue_wait_seconds_bucket" in e
            for e in exprs
        ), q


def test_dashboard_uses_only_exported_metrics() -> None:
    for title, expr in dashboard_exprs():
        assert unknown_metrics(expr) == set(), f"{title}: {expr}"


def test_dashboard_charts_every_runq_metric() -> None:
    used: set[str] = set()
    for _, expr in dashboard_exprs():
        used |= metric_names_in(expr)
    charted = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in used}
    assert runq_metric_families() - charted == set()


def test_dashboard_promql_parses(tmp_path: Path) -> None:
    """Each expression, with Grafana's variables filled in, is valid PromQL."""
    promtool = require_promtool()
    rules = []
    for i, (_, expr) in enumerate(dashboard_exprs()):
        concrete = expr.replace("$__rate_interval", "5m").replace("$job", ".*")
        concrete = concrete.replace("$instance", ".*")
        assert "$" not in concrete, expr
        rules.append({"record": f"runq:dashboard_check_{i}", "expr": concrete})
    path = tmp_path / "dashboard-exprs.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run_tool(promtool, "check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


# --- the documented installs ------------------------------------------------------------

README = ROOT / "README.md"


def marked_block(path: Path, mark: str) -> str:
    """The fence right below ``<!-- test: MARK -->`` in ``path``, dedented."""
    text = path.read_text(encoding="utf-8")
    match = re.search(
        rf"^( *)<!-- test: {re.escape(mark)} -->\n\1```\w+\n(?P<body>.*?)^\1```$",
        text,
        flags=re.M | re.S,
    )
    assert match, f"{path.name} has no block marked {mark!r}"
    indent = len(match.group(1))
    return "".join(line[indent:] for line in match.group("body").splitlines(keepends=True))


def production_install() -> list[str]:
    block = marked_block(OPERATIONS, "production-install")
    assert marked_block(README, "production-install") == block, (
        "README.md and docs/operations.md must show the same install block"
    )
    return block.splitlines()


def test_install_block_creates_the_virtualenv_the_unit_runs() -> None:
    lines = production_install()
    venv = next(shlex.split(line)[3] for line in lines if line.startswith("python3 -m venv "))
    assert any(line.split("&&")[-1].strip().startswith(f"{venv}/bin/pip install") for line in lines)
    argv = shlex.split(unit_value("Service", "ExecStart"))
    assert argv[0] == f"{venv}/bin/runq", "the unit must run the runq the install creates"


def test_install_block_installs_every_file_where_the_unit_reads_it() -> None:
    text = "\n".join(production_install())
    for source, target in (
        ("packaging/systemd/runq.service", "/etc/systemd/system/runq.service"),
        ("packaging/systemd/runq.sysusers", "/etc/sysusers.d/runq.conf"),
        ("packaging/systemd/runq.tmpfiles", "/etc/tmpfiles.d/runq.conf"),
        ("packaging/systemd/runq.toml", "/etc/runq/runq.toml"),
    ):
        assert re.search(rf"install .*{re.escape(source)}\s+{re.escape(target)}$", text, re.M)
        assert (ROOT / source).is_file()
    assert "--config /etc/runq/runq.toml" in unit_value("Service", "ExecStart")
    assert "EnvironmentFile=-/etc/runq/runq.env" in UNIT.read_text(encoding="utf-8")
    assert "systemctl enable --now runq" in text


def test_install_block_generates_the_key_the_shipped_config_needs(tmp_path: Path) -> None:
    """The shipped runq.toml uses key auth: the block must write RUNQ_API_KEY into the
    environment file the unit reads, from a generator that really prints a key."""
    config = load_config(UNIT_TOML, environ={})
    assert config.http.auth == "key"
    assert config.http.key == "env:RUNQ_API_KEY"
    line = next(
        line for line in production_install() if "/etc/runq/runq.env" in line and "echo" in line
    )
    assert line.startswith('echo "RUNQ_API_KEY=$(')
    assert line.endswith("> /etc/runq/runq.env")
    generated = tmp_path / "runq.env"
    script = line.replace("/etc/runq/runq.env", str(generated))
    result = run_tool("bash", "-euo", "pipefail", "-c", script)
    assert result.returncode == 0, result.stderr
    name, _, key = generated.read_text(encoding="utf-8").strip().partition("=")
    assert name == "RUNQ_API_KEY"
    assert len(key) >= 32
    assert key.isprintable()
    assert " " not in key
    # The file is created 0600 before the key is written into it.
    lines = production_install()
    mode_line = next(i for i, text in enumerate(lines) if "install -m 0600" in text)
    assert "/etc/runq/runq.env" in lines[mode_line]
    assert mode_line < lines.index(line)


def test_container_header_publishes_on_loopback_as_the_guide_does() -> None:
    header = CONTAINERFILE.read_text(encoding="utf-8")
    assert "-p 127.0.0.1:7777:7777" in header
    assert not re.search(r"-p 7777:7777", header)
    assert "-p 127.0.0.1:7777:7777" in OPERATIONS.read_text(encoding="utf-8")
