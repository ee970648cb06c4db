"""Finding 5 (service-account part): identity cannot be borrowed.

The CLI records its runs under the user id ``"cli"`` (``[cli] service_account``); a JWT
whose ``sub`` was ``cli`` then owned them: it could read their payload and answer and cancel
them. A run a service account submitted is marked so (``actor.service_account``, stored
with the run) and no token subject owns it; admins still see it.
"""

from __future__ import annotations

import json
import time

import jwt
import pytest
from serve_harness import RunqSetup, pg_ready, runq_engine, runq_setup

from runq.api.auth import JwtAuth
from runq.config import JwtConfig

pytestmark = [pytest.mark.anyio, pytest.mark.daemon]

__all__ = ["pg_ready", "runq_engine", "runq_setup"]  # fixtures used by name

SECRET = "a-test-secret-that-is-long-enough-for-every-hmac-algorithm-0123456789"


def _bearer(sub: str) -> str:
    claims = {"sub": sub, "exp": int(time.time()) + 300}
    return f"Bearer {jwt.encode(claims, SECRET, algorithm='HS256')}"


async def test_a_token_named_like_the_cli_does_not_own_cli_runs(runq_setup: RunqSetup) -> None:
    deferred = await runq_setup.cli("defer", "task/echo", "--payload", '{"secret": 1}')
    assert deferred.returncode == 0, deferred.stderr
    run_id = json.loads(deferred.stdout)["id"]
    async with runq_setup.queue() as q:
        run = await q.get(run_id)
    assert run is not None
    assert (run.user_id, run.actor.service_account) == ("cli", True)

    impostor = JwtAuth(JwtConfig(), SECRET).authenticate(_bearer("cli"))
    assert impostor.user_id == "cli"
    assert not impostor.owns(run)
    assert not impostor.can_read_content(run)
    assert not impostor.can_cancel(run)
    assert not impostor.can_see(run)
