"""Property-based API fuzz: schemathesis against the served OpenAPI document, and
hypothesis-generated JSON bodies.

Every operation of ``/schema/openapi.json`` gets schema-conforming (positive) and
schema-violating (negative) requests against a real ``runq serve`` on each engine, in open
mode and in key mode (with the key). No answer may be a 5xx, every status must be
documented and every body must match its documented schema; violating requests must be
refused with a 4xx. Arbitrary JSON (any shape, huge integers, deep-ish nesting) as a whole
body, as each field of a submission and as a continue decision must be answered with a
documented error, never a 5xx. Bounded: a fixed number of examples per operation and mode,
no shrinking, so each test runs in seconds per engine.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import pytest
import requests
import schemathesis
from api_support import api_config, bearer, server_env, submit, wait_status
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Err
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from serve_harness import (  # fixtures are used by name
    RunqServer,
    ServeFactory,
    runq_engine,
    runq_setup,
    serve_factory,
)

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]
__all__ = ["runq_engine", "runq_setup", "serve_factory"]

#: Per operation, generation mode and auth mode; tests/reliability runs ten times as many.
EXAMPLES_PER_OPERATION = 6
#: Hypothesis-generated bodies per kind (whole body, submission fields, continue decision).
JSON_BODY_EXAMPLES = 30
API_KEY = "fuzz-test-key-0123456789abcdef"
AUTH_CONFIGS: dict[str, dict[str, Any]] = {
    "open": {},
    "key": {"auth": "key", "key": "env:RUNQ_TEST_FUZZ_KEY"},
}
CONFORMANCE = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


async def start(serve_factory: ServeFactory, auth: str) -> tuple[RunqServer, dict[str, str]]:
    """A server in ``auth`` mode and the headers that authenticate to it."""
    config = api_config(http=AUTH_CONFIGS[auth])
    server = await serve_factory(config, env=server_env({"RUNQ_TEST_FUZZ_KEY": API_KEY}))
    return server, bearer(API_KEY) if auth == "key" else {}


async def known_ids(server: RunqServer, headers: dict[str, str]) -> list[str]:
    """Runs in several states, so fuzzed paths also reach existing runs (200s, 409s)."""
    queued = await submit(server, delay_seconds=3600, headers=headers)
    done = await submit(server, "task/echo", {"a": [1, 2]}, headers=headers)
    failed = await submit(server, "task/fail", {"permanent": True}, headers=headers)
    paused = await submit(server, "agent/approve", {"q": 1}, headers=headers)
    for run, status in ((paused, "paused"), (done, "completed"), (failed, "failed")):
        await wait_status(server, run["run_id"], status, headers=headers)
    return [r["run_id"] for r in (queued, done, failed, paused)]


@dataclass(frozen=True)
class Target:
    """Where the fuzz sends its requests, over one kept-alive session."""

    url: str
    session: requests.Session
    headers: dict[str, str]
    #: Statuses answered, to show the credentials went along (not 401 throughout).
    statuses: Counter[int] = field(default_factory=Counter)


def case_strategy(
    operation: Any, mode: GenerationMode, ids: list[str], headers: dict[str, str]
) -> st.SearchStrategy[Case[Any]]:
    # The credentials are an override schemathesis knows of: a negative case never counts
    # a removed Authorization header that the override then put back as "accepted".
    pinned = {"headers": headers} if headers else {}
    strategy: st.SearchStrategy[Case[Any]] = operation.as_strategy(generation_mode=mode, **pinned)
    names = [p.name for p in operation.path_parameters]
    if not names or mode is GenerationMode.NEGATIVE:
        return strategy
    # Half the examples aim at runs that exist; random ids only ever find 404.
    for run_id in ids:
        fixed = operation.as_strategy(
            generation_mode=mode, path_parameters={names[0]: run_id}, **pinned
        )
        strategy = strategy | fixed
    return strategy


def fuzz_operation(operation: Any, mode: GenerationMode, target: Target, ids: list[str]) -> None:
    checks: list[Callable[..., Any]] = list(CONFORMANCE)
    if mode is GenerationMode.NEGATIVE:
        checks.append(negative_data_rejection)

    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(case=case_strategy(operation, mode, ids, target.headers))
    def run(case: Case[Any]) -> None:
        response = case.call(base_url=target.url, session=target.session, timeout=10)
        target.statuses[response.status_code] += 1
        case.validate_response(response, checks=checks)

    run()


def _operation(result: Any) -> Any:
    """The operation of a schema entry; an entry the loader could not read fails the test."""
    if isinstance(result, Err):
        raise AssertionError(f"the OpenAPI document has an invalid operation: {result.err()}")
    return result.ok()


async def test_fuzz_finds_no_server_error_and_no_schema_violation(
    serve_factory: ServeFactory,
) -> None:
    """Both auth modes in one test per engine (a parameter would not survive the long
    variant in tests/reliability, which calls this function with the factory alone)."""
    for auth in AUTH_CONFIGS:
        server, headers = await start(serve_factory, auth)
        await fuzz_server(server, headers)


async def fuzz_server(server: RunqServer, headers: dict[str, str]) -> None:
    ids = await known_ids(server, headers)
    document = (await server.request("GET", "/schema/openapi.json")).json()
    schema = schemathesis.openapi.from_dict(document)
    # The event stream follows a live run until it ends (text/event-stream), which a
    # request-and-check fuzzer cannot drive; tests/follow covers it, bad input included.
    operations = [
        op
        for op in (_operation(result) for result in schema.get_all_operations())
        if not op.label.endswith("/events")
    ]
    assert len(operations) >= 11

    def fuzz_all() -> tuple[list[str], Counter[int]]:
        covered = []
        with requests.Session() as session:
            target = Target(url=server.url, session=session, headers=headers)
            for operation in operations:
                covered.extend(fuzz_modes(operation, target, ids))
        return covered, target.statuses

    covered, statuses = await anyio.to_thread.run_sync(fuzz_all)
    assert statuses[200] + statuses[202] > 0, statuses
    # String path parameters cannot be violated; bodies and query parameters can.
    for label in ("POST /runs", "POST /runs/{run_id}/continue", "GET /queue/jobs"):
        assert f"negative {label}" in covered, covered
    print("fuzzed:", ", ".join(covered))
    assert "Traceback" not in server.logs()


def fuzz_modes(operation: Any, target: Target, ids: list[str]) -> list[str]:
    covered = []
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        try:
            fuzz_operation(operation, mode, target, ids)
        except Unsatisfiable:
            # An operation with no parameters and no body has nothing to violate.
            assert mode is GenerationMode.NEGATIVE, operation.label
            continue
        covered.append(f"{mode.value} {operation.label}")
    return covered


# -- hypothesis-generated JSON bodies ----------------------------------------------------------

#: Any JSON value: integers past 64 bits, every float JSON can carry, any text, nested.
json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=30,
)
SUBMISSION_FIELDS = (
    "component_type",
    "component_id",
    "payload",
    "session_id",
    "configuration",
    "max_attempts",
    "deployment_id",
    "priority",
    "delay_seconds",
    "background",
)


@st.composite
def submissions(draw: st.DrawFn) -> Any:
    """A valid submission with some fields replaced by arbitrary JSON."""
    body: dict[str, Any] = {"component_type": "task", "component_id": "echo", "delay_seconds": 60}
    for name in draw(st.sets(st.sampled_from(SUBMISSION_FIELDS), max_size=3)):
        body[name] = draw(json_values)
    return body


def assert_answered(response: httpx.Response, *allowed: int) -> None:
    """Not a 5xx; an error is the documented JSON shape."""
    assert response.status_code < 500, response.text
    assert response.status_code in allowed, (response.status_code, response.text)
    if response.status_code >= 400:
        assert set(response.json()) == {"error", "detail"}, response.text


def post_json_bodies(client: httpx.Client, paused_id: str) -> None:
    @settings(
        max_examples=JSON_BODY_EXAMPLES,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    @given(whole=json_values, submission=submissions(), decision=json_values)
    def run(whole: Any, submission: Any, decision: Any) -> None:
        assert_answered(client.post("/runs", json=whole), 400)
        # 200: a sync route ran it; 202 stored; 400 refused; 429 a full queue.
        assert_answered(client.post("/runs", json=submission), 200, 202, 400, 429)
        continued = client.post(f"/runs/{paused_id}/continue", json={"decision": decision})
        # 409: an earlier example already continued the run.
        assert_answered(continued, 200, 409)

    run()


async def test_hypothesis_json_bodies_never_answer_a_server_error(
    serve_factory: ServeFactory,
) -> None:
    for auth in AUTH_CONFIGS:
        server, headers = await start(serve_factory, auth)
        paused = await submit(server, "agent/approve", {"q": 1}, headers=headers)
        await wait_status(server, paused["run_id"], "paused", headers=headers)
        with httpx.Client(base_url=server.url, headers=headers, timeout=10) as client:
            await anyio.to_thread.run_sync(post_json_bodies, client, paused["run_id"])
        assert "Traceback" not in server.logs()
