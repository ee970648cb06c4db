"""The one view of a run: each reader's role decides which fields are there, and a field
the role does not see is absent from the JSON, never null."""

from __future__ import annotations

import helpers
import msgspec

from runq.model import Actor, Run, Status
from runq.ops.views import (
    OPERATOR_VIEW,
    OWNER_CONTENT_VIEW,
    OWNER_VIEW,
    Role,
    RunView,
    Selection,
)

#: The run's state: every role sees these.
STATE = {
    "id",
    "component_type",
    "component_id",
    "session_id",
    "user_id",
    "status",
    "attempt",
    "max_attempts",
    "error",
    "locked_by",
    "locked_at",
    "idempotency_key",
    "created_at",
    "updated_at",
    "completed_at",
    "deployment_id",
    "available_at",
    "priority",
    "termination_reason",
    "pause_reason",
    "concurrency_key",
}


def a_run(**changes: object) -> Run:
    return helpers.a_run(
        user_id="u",
        actor=Actor(user_id="u"),
        payload={"secret": 1},
        answer={"done": True},
        **changes,
    )


def keys(view: RunView) -> set[str]:
    return set(msgspec.to_builtins(view))


def test_the_owner_sees_lifecycle_details_and_content_only_when_allowed() -> None:
    lifecycle = {"cancel_requested", "waiting", "timeout_seconds", "started_at", "tokens"}
    lifecycle |= {"cost", "pause"}
    assert keys(RunView.of(a_run(), OWNER_VIEW)) == STATE | lifecycle
    with_content = RunView.of(a_run(), OWNER_CONTENT_VIEW)
    assert keys(with_content) == STATE | lifecycle | {"payload", "answer"}
    assert with_content.payload == {"secret": 1}


def test_the_operator_sees_the_request_the_wait_and_the_sealed_error_but_no_answer() -> None:
    view = RunView.of(a_run(), OPERATOR_VIEW, error_detail="the whole text")
    assert keys(view) == STATE | {"payload", "waiting", "error_detail"}
    assert view.error_detail == "the whole text"
    body = msgspec.json.decode(msgspec.json.encode(view))
    assert body["waiting"] is None  # seen and empty: null, not absent


def test_a_paused_run_shows_its_question_to_the_owner() -> None:
    paused = a_run(status=Status.PAUSED, pause_reason="approve", pause_summary="Send it?")
    view = RunView.of(paused, OWNER_VIEW)
    assert view.pause is not None
    assert (view.pause.reason, view.pause.summary) == ("approve", "Send it?")
    assert RunView.of(a_run(), OWNER_VIEW).pause is None


def test_a_selection_narrows_and_widens_within_what_the_reader_may_see() -> None:
    narrow = OPERATOR_VIEW.only(frozenset({"waiting"}))
    assert keys(RunView.of(a_run(), narrow)) == STATE | {"waiting"}
    allowed = frozenset({"payload", "answer"})
    wide = Selection.for_role(Role.OWNER).including(frozenset({"answer", "error_detail"}), allowed)
    assert "answer" in wide.fields
    assert "error_detail" not in wide.fields
