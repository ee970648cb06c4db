"""Configuration: defaults, every constraint naming its key, unknown keys with a
suggestion, environment overrides, malformed and missing files."""

from __future__ import annotations

from pathlib import Path

import pytest

from runq.config import Config, load_config, redact_url, store_engine
from runq.errors import ConfigError
from runq.maintenance.reaper import ReaperConfig
from runq.maintenance.retention import RetentionConfig
from runq.serve.exporter import ExporterConfig
from runq.worker.claimer import ClaimerConfig
from runq.worker.executor import ExecutorConfig
from runq.worker.heartbeat import HeartbeatConfig
from runq.worker.registry import WorkerRegistryConfig


def load(text: str, environ: dict[str, str] | None = None, *, tmp: Path) -> Config:
    path = tmp / "runq.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, environ=environ or {})


def refused(text: str, tmp: Path, environ: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as excinfo:
        load(text, environ, tmp=tmp)
    return excinfo.value


# -- defaults ------------------------------------------------------------------------------


def test_defaults_match_the_design() -> None:
    c = load_config(None, environ={})
    assert c == load_config(environ={"UNRELATED": "1"})
    assert (c.store.url, c.store.schema) == ("sqlite:///runq.db", "runq")
    q = c.queue
    assert q.max_attempts == 1
    assert q.retry_delay_seconds == 30
    assert q.timeout_seconds == 3600
    assert q.lock_grace_seconds == 60
    assert q.stop_timeout_seconds is None
    assert q.effective_stop_timeout == 30
    assert q.heartbeat_interval == 20
    assert q.poll_interval == 1.0
    assert q.max_concurrency == 32
    assert q.max_queue_depth == 1000
    assert q.retention_seconds == 86400
    assert q.paused_retention_seconds == 0
    assert q.deployment_id == ""
    assert q.deployment is None
    assert q.serialize_sessions is True
    assert q.worker is True
    assert c.reaper.limit == 50
    h = c.http
    assert (h.listen, h.auth, h.allow_open_on_public) == ("127.0.0.1:7777", "open", False)
    assert h.key == "env:RUNQ_API_KEY"
    assert h.max_body_bytes == 1048576
    assert h.host_port == ("127.0.0.1", 7777)
    j = h.jwt
    assert j.secret == "env:RUNQ_JWT_SECRET"
    assert j.algorithms == ("HS256",)
    assert (j.issuer, j.audience) == ("", "")
    assert j.leeway_seconds == 30
    assert j.scopes_claim == "scope"
    assert (j.admin_scope, j.approve_scope) == ("runq:admin", "runq:approve")
    assert c.seal.keys == ()
    assert c.cli.service_account == "cli"
    assert c.budget.limits == ()
    assert c.privacy.level == "metadata"
    assert c.routing == {}, "an unrouted component uses sync"
    assert c.components == {}


def test_the_example_config_loads(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[2] / "config.example.toml"
    if not example.exists():
        pytest.skip("no config.example.toml in this checkout")
    config = load_config(example, environ={})
    assert config.queue.lock_grace_seconds == 60


def test_stop_timeout_defaults_below_a_small_lock_grace(tmp_path: Path) -> None:
    c = load("[queue]\nlock_grace_seconds = 3\n", tmp=tmp_path)
    assert c.queue.effective_stop_timeout == 2
    assert c.queue.heartbeat_interval == 1


def test_each_service_takes_its_settings_from_the_config(tmp_path: Path) -> None:
    """One mapping from config to each service: every setting read from the file, none
    from a default of the service's own."""
    c = load(
        """
[queue]
max_concurrency = 7
poll_interval = 0.25
lock_grace_seconds = 90
timeout_seconds = 12
retry_delay_seconds = 3
retention_seconds = 100
paused_retention_seconds = 5
retention_interval_seconds = 11
deployment_id = "gpu"
serialize_sessions = false

[reaper]
limit = 9

[privacy]
level = "full"
redacted_max_chars = 100
""",
        tmp=tmp_path,
    )
    assert ClaimerConfig.from_config(c) == ClaimerConfig(
        max_concurrency=7, poll_interval=0.25, deployment_id="gpu", serialize_sessions=False
    )
    assert HeartbeatConfig.from_config(c) == HeartbeatConfig(interval=30.0)
    executor = ExecutorConfig.from_config(c)
    assert (executor.timeout_seconds, executor.settle_timeout_seconds) == (12, 90)
    assert (executor.max_threads, executor.retry_delay_seconds) == (7, 3)
    assert (executor.privacy_level, executor.redacted_max_chars) == ("full", 100)
    assert ExecutorConfig.from_config(c, settle_until_decided=True).settle_timeout_seconds is None
    assert ReaperConfig.from_config(c) == ReaperConfig(
        lock_grace_seconds=90, limit=9, interval=0.25, privacy_level="full", redacted_max_chars=100
    )
    assert ReaperConfig.from_config(c, limit=3).limit == 3
    retention = RetentionConfig.from_config(c)
    assert (retention.retention_seconds, retention.paused_retention_seconds) == (100, 5)
    assert retention.interval == 11
    assert WorkerRegistryConfig.from_config(c).deployment_id == "gpu"
    exporter = ExporterConfig.from_config(c)
    assert exporter.lock_grace_seconds == 90
    assert exporter.worker_max_age_seconds == 90  # three heartbeats of 30 s


def test_a_full_file_is_read(tmp_path: Path) -> None:
    c = load(
        """
[store]
url = "postgresql://runq@db:5432/runq"
schema = "tenant_a"

[queue]
max_attempts = 3
lock_grace_seconds = 90
stop_timeout_seconds = 45
deployment_id = "gpu-pool"
serialize_sessions = false

[http]
listen = "0.0.0.0:8080"
auth = "jwt"

[http.jwt]
algorithms = ["RS256"]
public_key = "file:/etc/runq/jwt.pub"

[seal]
keys = ["env:RUNQ_SEAL_KEY", "file:/etc/runq/old.key"]

[[budget.limits]]
scope = "both"
period = "month"
max_cost = 10.5
max_runs = 100

[privacy]
level = "redacted"

[routing]
"agent/*" = "postgres"
"*" = "local"

[components]
"agent/summarize" = "myapp.agents:summarize"
"task/render" = { kind = "http", url = "http://127.0.0.1:8080/render" }
""",
        tmp=tmp_path,
    )
    assert store_engine(c.store.url) == "postgres"
    assert c.store.schema == "tenant_a"
    assert (c.queue.max_attempts, c.queue.effective_stop_timeout) == (3, 45)
    assert c.queue.deployment == "gpu-pool"
    assert c.queue.serialize_sessions is False
    assert c.http.host_port == ("0.0.0.0", 8080)
    assert c.http.jwt.algorithms == ("RS256",)
    assert c.seal.keys == ("env:RUNQ_SEAL_KEY", "file:/etc/runq/old.key")
    [limit] = c.budget.limits
    assert (limit.scope, limit.period, limit.max_cost, limit.max_runs) == (
        "both",
        "month",
        10.5,
        100,
    )
    assert limit.max_tokens is None
    assert c.privacy.level == "redacted"
    assert c.routing == {"agent/*": "postgres", "*": "local"}
    assert c.components["task/render"] == {"kind": "http", "url": "http://127.0.0.1:8080/render"}


# -- every constraint names its key --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[queue]\nlock_grace_seconds = 2.9", "queue.lock_grace_seconds"),
        ("[queue]\nstop_timeout_seconds = 60", "queue.stop_timeout_seconds"),
        (
            "[queue]\nlock_grace_seconds = 10\nstop_timeout_seconds = 10",
            "queue.stop_timeout_seconds",
        ),
        ("[queue]\nstop_timeout_seconds = -1", "queue.stop_timeout_seconds"),
        ("[queue]\nmax_attempts = 0", "queue.max_attempts"),
        ("[queue]\nmax_attempts = -3", "queue.max_attempts"),
        ("[queue]\nretry_delay_seconds = -1", "queue.retry_delay_seconds"),
        ("[queue]\ntimeout_seconds = 0", "queue.timeout_seconds"),
        ("[queue]\npoll_interval = 0", "queue.poll_interval"),
        ("[queue]\nmax_concurrency = 0", "queue.max_concurrency"),
        ("[queue]\nmax_concurrency = 10001", "queue.max_concurrency"),
        ("[queue]\nmax_queue_depth = -1", "queue.max_queue_depth"),
        ("[queue]\nretention_seconds = 0", "queue.retention_seconds"),
        ("[queue]\npaused_retention_seconds = -5", "queue.paused_retention_seconds"),
        ("[queue]\nretention_interval_seconds = 0", "queue.retention_interval_seconds"),
        (f'[queue]\ndeployment_id = "{"x" * 201}"', "queue.deployment_id"),
        ("[reaper]\nlimit = 0", "reaper.limit"),
        ("[reaper]\nlimit = 10001", "reaper.limit"),
        ('[privacy]\nlevel = "everything"', "privacy.level"),
        ("[privacy]\nredacted_max_chars = 5", "privacy.redacted_max_chars"),
        ('[store]\nurl = "mysql://root@db/runq"', "store.url"),
        ('[store]\nschema = "Bad-Name"', "store.schema"),
        ('[store]\nschema = "1abc"', "store.schema"),
        ('[http]\nauth = "token"', "http.auth"),
        ('[http]\nlisten = "7777"', "http.listen"),
        ('[http]\nlisten = "127.0.0.1:99999"', "http.listen"),
        ("[http]\nmax_body_bytes = 10", "http.max_body_bytes"),
        ('[http]\nauth = "key"\nkey = "hunter2"', "http.key"),
        ('[seal]\nkeys = ["hunter2"]', "seal.keys[0]"),
        ('[seal]\nkeys = ["env:OK", "vault:x"]', "seal.keys[1]"),
        ('[cli]\nservice_account = "  "', "cli.service_account"),
        ('[budget]\ntimezone = "Mars/Olympus_Mons"', "budget.timezone"),
        ('[[budget.limits]]\nscope = "team"\nmax_runs = 1', "budget.limits[0].scope"),
        ('[[budget.limits]]\nperiod = "week"\nmax_runs = 1', "budget.limits[0].period"),
        ('[[budget.limits]]\nscope = "user"', "budget.limits[0]"),
        (
            "[[budget.limits]]\nmax_runs = 1\n[[budget.limits]]\nmax_cost = -1",
            "budget.limits[1].max_cost",
        ),
        ('[routing]\n"*" = "kafka"', 'routing."*"'),
        ('[routing]\n"agent/*" = "postgres"', 'routing."agent/*"'),
        ('[routing]\n"agent" = "local"', 'routing."agent"'),
        ('[routing]\n"*" = 5', 'routing."*"'),
        ('[components]\n"agent/x" = "myapp.agents.summarize"', 'components."agent/x"'),
        ('[components]\n"agent/x" = "myapp:"', 'components."agent/x"'),
        ('[components]\n"robot/x" = "a:b"', 'components."robot/x"'),
        ('[components]\n"agent" = "a:b"', 'components."agent"'),
        ('[components]\n"task/x" = { kind = "grpc" }', 'components."task/x".kind'),
        ('[components]\n"task/x" = 5', 'components."task/x"'),
        ('[queue]\nmax_attempts = "three"', "queue.max_attempts"),
        ("[queue]\nmax_attempts = 2.5", "queue.max_attempts"),
        ('[queue]\nworker = "yes"', "queue.worker"),
        ("[queue]\ndeployment_id = 5", "queue.deployment_id"),
        ('[[budget.limits]]\nmax_cost = "ten"', "budget.limits[0].max_cost"),
        ('store = "sqlite:///x.db"', "store"),
    ],
)
def test_every_constraint_names_its_key(tmp_path: Path, text: str, key: str) -> None:
    error = refused(text, tmp_path)
    assert error.key == key
    assert str(error).startswith(f"{key}: ")


@pytest.mark.parametrize("grace", [3, 3.5, 600])
def test_lock_grace_of_three_or_more_is_accepted(tmp_path: Path, grace: float) -> None:
    assert (
        load(f"[queue]\nlock_grace_seconds = {grace}", tmp=tmp_path).queue.lock_grace_seconds
        == grace
    )


def test_stop_timeout_just_below_lock_grace_is_accepted(tmp_path: Path) -> None:
    c = load("[queue]\nlock_grace_seconds = 10\nstop_timeout_seconds = 9.5", tmp=tmp_path)
    assert c.queue.effective_stop_timeout == 9.5


@pytest.mark.parametrize("level", ["none", "metadata", "redacted", "full"])
def test_every_privacy_level_is_accepted(tmp_path: Path, level: str) -> None:
    assert load(f'[privacy]\nlevel = "{level}"', tmp=tmp_path).privacy.level == level


@pytest.mark.parametrize("transport", ["sync", "local"])
def test_transports_on_sqlite(tmp_path: Path, transport: str) -> None:
    c = load(f'[routing]\n"task/*" = "{transport}"\n"*" = "sync"', tmp=tmp_path)
    assert c.routing["task/*"] == transport


def test_postgres_transport_on_postgres(tmp_path: Path) -> None:
    c = load('[store]\nurl = "postgresql://u@h/db"\n[routing]\n"*" = "postgres"', tmp=tmp_path)
    assert c.routing == {"*": "postgres"}


def test_open_auth_on_a_public_address(tmp_path: Path) -> None:
    for host in ("0.0.0.0", "192.168.1.10", "runq.example.com", "[::]"):
        error = refused(f'[http]\nlisten = "{host}:7777"', tmp_path)
        assert error.key == "http.auth"
        assert "allow_open_on_public" in str(error)
    allowed = load('[http]\nlisten = "0.0.0.0:7777"\nallow_open_on_public = true', tmp=tmp_path)
    assert allowed.http.host_port == ("0.0.0.0", 7777)
    keyed = load('[http]\nlisten = "0.0.0.0:7777"\nauth = "key"', tmp=tmp_path)
    assert keyed.http.auth == "key"


@pytest.mark.parametrize(
    "listen", ["127.0.0.1:7777", "127.0.0.2:1", "localhost:80", "[::1]:7777", ""]
)
def test_open_auth_on_loopback_or_no_http(tmp_path: Path, listen: str) -> None:
    c = load(f'[http]\nlisten = "{listen}"', tmp=tmp_path)
    assert c.http.listen == listen


def test_jwt_settings(tmp_path: Path) -> None:
    base = '[http]\nauth = "jwt"\n[http.jwt]\n'
    assert load(base + 'algorithms = ["HS256", "HS512"]', tmp=tmp_path).http.jwt.algorithms == (
        "HS256",
        "HS512",
    )
    for text, key in [
        ('algorithms = ["HS256", "RS256"]', "http.jwt.algorithms"),
        ('algorithms = ["none"]', "http.jwt.algorithms"),
        ("algorithms = []", "http.jwt.algorithms"),
        ('algorithms = ["RS256"]', "http.jwt.public_key"),
        ('algorithms = ["ES256"]\npublic_key = "inline-pem"', "http.jwt.public_key"),
        ('secret = "hunter2"', "http.jwt.secret"),
        ("leeway_seconds = -1", "http.jwt.leeway_seconds"),
        ('scopes_claim = ""', "http.jwt.scopes_claim"),
    ]:
        assert refused(base + text, tmp_path).key == key, text
    rs = load(base + 'algorithms = ["RS256"]\npublic_key = "file:/etc/jwt.pub"', tmp=tmp_path)
    assert rs.http.jwt.public_key == "file:/etc/jwt.pub"


def test_jwt_keys_are_not_checked_without_jwt_auth(tmp_path: Path) -> None:
    c = load('[http.jwt]\nalgorithms = ["RS256"]', tmp=tmp_path)
    assert c.http.auth == "open"


# -- unknown keys --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "suggestion"),
    [
        ("[queue]\nlock_grace = 5", "queue.lock_grace", "lock_grace_seconds"),
        ("[queue]\nmax_attempt = 2", "queue.max_attempt", "max_attempts"),
        ("[queu]\nmax_attempts = 2", "queu", "queue"),
        ('[http.jwt]\nisuer = "x"', "http.jwt.isuer", "issuer"),
        ('[http]\nlistn = "x"', "http.listn", "listen"),
        ('[[budget.limits]]\nscop = "user"\nmax_cost = 1', "budget.limits[0].scop", "scope"),
        ('[store]\nulr = "sqlite:///x.db"', "store.ulr", "url"),
    ],
)
def test_unknown_key_suggests_the_nearest_known_one(
    tmp_path: Path, text: str, key: str, suggestion: str
) -> None:
    error = refused(text, tmp_path)
    assert error.key == key
    assert f"'{suggestion}'" in str(error)


def test_unknown_key_far_from_any_lists_the_known_ones(tmp_path: Path) -> None:
    error = refused("[queue]\nzzzzzz = 1", tmp_path)
    assert error.key == "queue.zzzzzz"
    assert "lock_grace_seconds" in str(error)


# -- environment ---------------------------------------------------------------------------


def test_env_overrides_known_keys(tmp_path: Path) -> None:
    c = load(
        '[store]\nurl = "sqlite:///file.db"\n[queue]\ndeployment_id = "file"',
        {
            "RUNQ_STORE_URL": "postgresql://runq@db:5432/runq",
            "RUNQ_QUEUE_DEPLOYMENT_ID": "gpu-pool",
            "RUNQ_HTTP_LISTEN": "127.0.0.1:9999",
            "RUNQ_QUEUE_MAX_ATTEMPTS": "3",
            "RUNQ_QUEUE_POLL_INTERVAL": "0.25",
            "RUNQ_QUEUE_SERIALIZE_SESSIONS": "false",
            "RUNQ_SEAL_KEYS": "env:NEW_KEY, file:/etc/old.key",
            "RUNQ_HTTP_JWT_SECRET": "env:OTHER_SECRET",
        },
        tmp=tmp_path,
    )
    assert c.store.url == "postgresql://runq@db:5432/runq"
    assert c.queue.deployment_id == "gpu-pool"
    assert c.http.listen == "127.0.0.1:9999"
    assert c.queue.max_attempts == 3
    assert isinstance(c.queue.max_attempts, int)
    assert c.queue.poll_interval == 0.25
    assert c.queue.serialize_sessions is False
    assert c.seal.keys == ("env:NEW_KEY", "file:/etc/old.key")
    assert c.http.jwt.secret == "env:OTHER_SECRET"


def test_env_list_as_json(tmp_path: Path) -> None:
    c = load("", {"RUNQ_SEAL_KEYS": '["env:A", "env:B"]'}, tmp=tmp_path)
    assert c.seal.keys == ("env:A", "env:B")


def test_unrelated_runq_variables_are_ignored(tmp_path: Path) -> None:
    c = load(
        "",
        {
            "RUNQ_API_KEY": "secret",
            "RUNQ_SEAL_KEY": "x",
            "RUNQ_QUEUE_NO_SUCH_KEY": "1",
            "RUNQ_NOSECTION_URL": "x",
            "RUNQ_TEST_POSTGRES_URL": "postgresql://x",
            "RUNQ_ROUTING_X": "sync",
        },
        tmp=tmp_path,
    )
    assert c == load_config(None, environ={})


def test_env_values_are_validated_and_name_the_key(tmp_path: Path) -> None:
    assert refused("", tmp_path, {"RUNQ_QUEUE_SERIALIZE_SESSIONS": "maybe"}).key == (
        "queue.serialize_sessions"
    )
    assert refused("", tmp_path, {"RUNQ_QUEUE_MAX_ATTEMPTS": "lots"}).key == "queue.max_attempts"
    assert refused("", tmp_path, {"RUNQ_QUEUE_MAX_ATTEMPTS": "0"}).key == "queue.max_attempts"
    assert refused("", tmp_path, {"RUNQ_QUEUE_LOCK_GRACE_SECONDS": "1"}).key == (
        "queue.lock_grace_seconds"
    )
    assert refused("", tmp_path, {"RUNQ_HTTP_LISTEN": "0.0.0.0:80"}).key == "http.auth"
    assert refused("", tmp_path, {"RUNQ_STORE_URL": "redis://x"}).key == "store.url"


@pytest.mark.parametrize(
    ("raw", "value"),
    [("1", True), ("yes", True), ("ON", True), ("0", False), ("no", False), ("off", False)],
)
def test_env_booleans(tmp_path: Path, raw: str, value: bool) -> None:
    assert load("", {"RUNQ_QUEUE_WORKER": raw}, tmp=tmp_path).queue.worker is value


def test_runq_config_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "from-env.toml"
    path.write_text("[queue]\nmax_attempts = 4\n")
    assert load_config(None, environ={"RUNQ_CONFIG": str(path)}).queue.max_attempts == 4
    other = tmp_path / "explicit.toml"
    other.write_text("[queue]\nmax_attempts = 5\n")
    assert load_config(other, environ={"RUNQ_CONFIG": str(path)}).queue.max_attempts == 5


def test_store_url_argument_wins(tmp_path: Path) -> None:
    c = load_config(
        None,
        environ={"RUNQ_STORE_URL": "sqlite:///env.db"},
        store_url="postgresql://cli@h/db",
    )
    assert c.store.url == "postgresql://cli@h/db"
    with pytest.raises(ConfigError) as excinfo:
        load_config(None, environ={}, store_url="mysql://x")
    assert excinfo.value.key == "store.url"


# -- files ---------------------------------------------------------------------------------


def test_malformed_toml(tmp_path: Path) -> None:
    error = refused("[queue\nmax_attempts = ", tmp_path)
    assert error.key == "--config"
    assert "not valid TOML" in str(error)
    assert str(tmp_path / "runq.toml") in str(error)


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as excinfo:
        load_config(missing, environ={})
    assert excinfo.value.key == "--config"
    assert "no such file" in str(excinfo.value)
    with pytest.raises(ConfigError):
        load_config(None, environ={"RUNQ_CONFIG": str(missing)})


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(tmp_path, environ={})  # a directory
    assert excinfo.value.key == "--config"


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'[cli]\nservice_account = "caf\xe9"\n')
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, environ={})
    assert excinfo.value.key == "--config"


def test_the_config_is_frozen() -> None:
    c = load_config(None, environ={})
    with pytest.raises(AttributeError):
        c.queue.max_attempts = 5  # type: ignore[misc]


def test_redact_url_hides_the_password() -> None:
    assert redact_url("postgresql://runq:s3cret@db:5432/x") == "postgresql://runq:***@db:5432/x"
    assert redact_url("postgresql://runq@db/x") == "postgresql://runq@db/x"
    with pytest.raises(ConfigError) as excinfo:
        store_engine("mysql://root:s3cret@db/x")
    assert "s3cret" not in str(excinfo.value)


def test_http_edge_settings_name_their_key(tmp_path: Path) -> None:
    c = load_config(None, environ={})
    assert c.http.allowed_hosts == ()
    assert c.http.user_priority_range == (0, 100)
    set_ = load(
        '[http]\nallowed_hosts = ["runq.internal", "10.0.0.5:7777", "[::1]", "::1", "*"]\n'
        "user_priority_range = [-10, 10]",
        tmp=tmp_path,
    )
    assert set_.http.allowed_hosts[0] == "runq.internal"
    assert set_.http.user_priority_range == (-10, 10)
    from_env = load("", {"RUNQ_HTTP_USER_PRIORITY_RANGE": "5,50"}, tmp=tmp_path)
    assert from_env.http.user_priority_range == (5, 50)
    for text in (
        'allowed_hosts = ["https://runq.internal"]',
        'allowed_hosts = ["runq.internal/path"]',
        'allowed_hosts = ["two words"]',
        'allowed_hosts = [""]',
        'allowed_hosts = ["host\\n"]',
        "allowed_hosts = [1]",
    ):
        assert refused(f"[http]\n{text}", tmp_path).key.startswith("http.allowed_hosts"), text
    for text in ("[10, 0]", "[0]", "[0, 1, 2]", "[-2000000, 0]", '["a", "b"]'):
        error = refused(f"[http]\nuser_priority_range = {text}", tmp_path)
        assert error.key.startswith("http.user_priority_range"), (text, error)


# -- a PostgreSQL cluster ------------------------------------------------------------------


def test_a_multi_host_url_that_asks_for_the_writable_server_is_accepted(tmp_path: Path) -> None:
    for url in (
        "postgresql://runq@h1:5432,h2:5433/runq",
        "postgresql://runq@h1:5432,h2:5433/runq?target_session_attrs=read-write",
        "postgresql://runq@db.internal/runq?target_session_attrs=primary",
    ):
        c = load(f'[store]\nurl = "{url}"\n', tmp=tmp_path)
        assert c.store.url == url


def test_a_url_that_would_land_on_a_standby_is_refused_naming_the_key(tmp_path: Path) -> None:
    for key, value in (("url", "standby"), ("url", "any"), ("listen_url", "prefer-standby")):
        url = f"postgresql://runq@h1,h2/runq?target_session_attrs={value}"
        base = "" if key == "url" else 'url = "postgresql://runq@h1/runq"\n'
        error = refused(f'[store]\n{base}{key} = "{url}"\n', tmp_path)
        assert error.key == f"store.{key}"
        assert "read-write" in str(error)


def test_requiring_synchronous_replication_needs_postgresql(tmp_path: Path) -> None:
    error = refused("[store]\nrequire_synchronous_replication = true\n", tmp_path)
    assert error.key == "store.require_synchronous_replication"
    c = load(
        '[store]\nurl = "postgresql://runq@h1/runq"\nrequire_synchronous_replication = true\n',
        tmp=tmp_path,
    )
    assert c.store.require_synchronous_replication
    env = {"RUNQ_STORE_REQUIRE_SYNCHRONOUS_REPLICATION": "true"}
    assert load(
        '[store]\nurl = "postgresql://runq@h1/runq"\n', env, tmp=tmp_path
    ).store.require_synchronous_replication
