"""Property-based API fuzz: schemathesis against the served OpenAPI document.

Every operation of ``/schema/openapi.json`` gets schema-conforming (positive) and
schema-violating (negative) requests against a real ``runq serve`` on each engine. No
answer may be a 5xx, every status must be documented and every body must match its
documented schema; violating requests must be refused with a 4xx. Bounded: a fixed number
of examples per operation and mode, no shrinking deadline, well under a minute per engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import pytest
import schemathesis
from api_support import api_config, server_env, submit, wait_status
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

EXAMPLES_PER_OPERATION = 40
CONFORMANCE = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]


async def known_ids(server: RunqServer) -> list[str]:
    """Runs in several states, so fuzzed paths also reach existing runs (200s, 409s)."""
    queued = await submit(server, delay_seconds=3600)
    done = await submit(server, "task/echo", {"a": [1, 2]})
    failed = await submit(server, "task/fail", {"permanent": True})
    paused = await submit(server, "agent/approve", {"q": 1})
    await wait_status(server, paused["run_id"], "paused")
    await wait_status(server, done["run_id"], "completed")
    await wait_status(server, failed["run_id"], "failed")
    return [r["run_id"] for r in (queued, done, failed, paused)]


def case_strategy(
    operation: Any, mode: GenerationMode, ids: list[str]
) -> st.SearchStrategy[Case[Any]]:
    strategy: st.SearchStrategy[Case[Any]] = operation.as_strategy(generation_mode=mode)
    names = [p.name for p in operation.path_parameters]
    if not names or mode is GenerationMode.NEGATIVE:
        return strategy
    # Half the examples aim at runs that exist; random ids only ever find 404.
    for run_id in ids:
        fixed = operation.as_strategy(generation_mode=mode, path_parameters={names[0]: run_id})
        strategy = strategy | fixed
    return strategy


def fuzz_operation(operation: Any, mode: GenerationMode, base_url: str, ids: list[str]) -> None:
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
    @given(case=case_strategy(operation, mode, ids))
    def run(case: Case[Any]) -> None:
        response = case.call(base_url=base_url, timeout=10)
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
    server = await serve_factory(api_config(), env=server_env())
    ids = await known_ids(server)
    document = (await server.request("GET", "/schema/openapi.json")).json()
    schema = schemathesis.openapi.from_dict(document)
    operations = [_operation(result) for result in schema.get_all_operations()]
    assert len(operations) >= 11

    def fuzz_all() -> list[str]:
        covered = []
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                try:
                    fuzz_operation(operation, mode, server.url, ids)
                except Unsatisfiable:
                    # An operation with no parameters and no body has nothing to violate.
                    assert mode is GenerationMode.NEGATIVE, operation.label
                    continue
                covered.append(f"{mode.value} {operation.label}")
        return covered

    covered = await anyio.to_thread.run_sync(fuzz_all)
    # String path parameters cannot be violated; bodies and query parameters can.
    for label in ("POST /runs", "POST /runs/{run_id}/continue", "GET /queue/jobs"):
        assert f"negative {label}" in covered, covered
    print("fuzzed:", ", ".join(covered))
    assert "Traceback" not in server.logs()
