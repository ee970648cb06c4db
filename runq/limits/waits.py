"""Why a queued run is not running: the first rule, in the claim's own order, that holds
it back. Pure: the caller reads the inputs (one pass each) and this decides."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

from runq.limits.rules import LimitRules, LimitState, rate_window
from runq.model import Pause, QueuedCount, Run, Status, WaitReason, wait_time


def pause_of(pauses: Sequence[Pause], component: str, deployment_id: str | None) -> Pause | None:
    """The pause that holds runs of ``component`` on ``deployment_id``, if any."""
    for p in pauses:
        if p.kind == "deployment" and p.target == (deployment_id or ""):
            return p
        if p.kind == "component" and fnmatch.fnmatchcase(component, p.target):
            return p
    return None


@dataclass(frozen=True)
class WaitInputs:
    state: LimitState
    pauses: Sequence[Pause]
    #: The session rule holds the run back (an older or running run of its session).
    session_ahead: bool = False
    #: Some live worker claims the run's deployment (always True for runs with none).
    deployment_served: bool = True
    #: The budget limit the run's user or configuration has spent (``BudgetGate.hold``).
    budget: WaitReason | None = None


def limit_hold(
    rules: LimitRules, component: str, state: LimitState, key: str | None = None
) -> WaitReason | None:
    """The limit or rate of ``component``'s group (and of its concurrency ``key``) when it
    has no room now."""
    i = rules.group_of(component)
    if i is None:
        return None
    g = rules.groups[i]
    if key is not None and g.max_running_per_key is not None:
        same = sum(n for (c, k), n in state.keys.items() if k == key and rules.group_of(c) == i)
        if same >= g.max_running_per_key:
            return WaitReason(
                kind="limit",
                pattern=g.pattern,
                message=f"held by limit {g.pattern} for key {key}"
                f" ({same}/{g.max_running_per_key} running)",
            )
    if g.max_running is not None:
        running = rules.running_by_group(state.running.items())[i]
        if running >= g.max_running:
            return WaitReason(
                kind="limit",
                pattern=g.pattern,
                message=f"held by limit {g.pattern} ({running}/{g.max_running} running)",
            )
    if g.rate is not None:
        used = rules.rate_used(state.now, state.windows)[i]
        if used >= g.rate[0]:
            until = rate_window(state.now, g.rate[1]) + g.rate[1]
            return WaitReason(
                kind="rate",
                pattern=g.pattern,
                until=until,
                message=f"rate {g.pattern} (next slot at {wait_time(until)})",
            )
    return None


def explain(run: Run, rules: LimitRules, inputs: WaitInputs) -> WaitReason | None:
    if run.status is not Status.QUEUED:
        return None
    if run.available_at > inputs.state.now:
        return WaitReason(
            kind="delayed",
            until=run.available_at,
            message=f"delayed until {wait_time(run.available_at)}",
        )
    pause = pause_of(inputs.pauses, run.component, run.deployment_id)
    if pause is not None:
        return WaitReason(
            kind="paused",
            pattern=pause.target,
            message=f"paused ({pause.kind} {pause.target}"
            + (f": {pause.reason})" if pause.reason else ")"),
        )
    if inputs.session_ahead:
        return WaitReason(
            kind="session", message=f"behind an earlier run of session {run.session_id}"
        )
    if inputs.budget is not None:
        return inputs.budget
    held = limit_hold(rules, run.component, inputs.state, run.concurrency_key)
    if held is not None:
        return held
    if not inputs.deployment_served:
        return WaitReason(
            kind="no_worker", message=f"no live worker serves deployment {run.deployment_id}"
        )
    return None


#: The reasons the exporter counts held-back runs by (``runq_held_runs``).
HELD_REASONS = ("delayed", "paused", "budget", "limit", "rate", "no_worker")


def held_counts(
    queued: Sequence[QueuedCount],
    rules: LimitRules,
    state: LimitState,
    pauses: Sequence[Pause],
    served_deployments: set[str],
) -> dict[str, int]:
    """Queued runs held back, by reason, from the per-(component, deployment) counts of
    ``Store.queued_by_component``: one decision per group of runs, never one per run, in
    ``explain``'s order. The store counts the budget holds of each group (they depend on
    each run's user and configuration); session holds depend on each run's session and
    are not counted."""
    counts = dict.fromkeys(HELD_REASONS, 0)
    for group in queued:
        component, deployment = group.component, group.deployment_id
        counts["delayed"] += group.delayed
        ready = group.ready
        if not ready:
            continue
        if pause_of(pauses, component, deployment or None) is not None:
            counts["paused"] += ready
            continue
        counts["budget"] += group.budget_held
        ready -= group.budget_held
        if not ready:
            continue
        held = limit_hold(rules, component, state)
        if held is not None:
            counts[held.kind] += ready
        elif deployment and deployment not in served_deployments:
            counts["no_worker"] += ready
    return counts
