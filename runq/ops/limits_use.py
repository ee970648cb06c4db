"""The limits page's numbers: each ``[limits]`` group's use now and the runs it holds
back, and what each active pause holds. Pure: the page reads the inputs (the same few
grouped reads the exporter's held-back counts use) and this adds them up per group,
deciding once per (component, deployment) group of queued runs, never once per run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runq.limits import GroupRule, LimitRules, LimitState, Pause, rate_window
from runq.limits.waits import limit_hold, pause_of
from runq.model import QueuedCount


@dataclass(frozen=True)
class GroupUse:
    rule: GroupRule
    running: int
    #: Starts counted in the current rate window, and when that window ends.
    rate_used: int
    rate_window_ends: float | None
    #: Concurrency keys at their ``max_running_per_key`` now.
    keys_at_cap: int
    #: Queued runs of the group due now, and those of them a limit or the rate holds back.
    ready: int
    held: int

    @property
    def full(self) -> bool:
        return self.held > 0


@dataclass(frozen=True)
class PauseUse:
    pause: Pause
    #: Queued runs due now that the pause holds back.
    held: int


def _keys_at_cap(rules: LimitRules, state: LimitState) -> list[int]:
    per_key_max = rules.per_key_max()
    at_cap = [0] * len(rules.groups)
    for i, _key, running in rules.key_running(
        (component, key, n) for (component, key), n in state.keys.items()
    ):
        if running >= per_key_max[i]:
            at_cap[i] += 1
    return at_cap


def limits_use(
    rules: LimitRules,
    state: LimitState,
    pauses: Sequence[Pause],
    queued: Sequence[QueuedCount],
) -> tuple[list[GroupUse], list[PauseUse]]:
    """``queued`` is ``Store.queued_by_component``."""
    n = len(rules.groups)
    running = rules.running_by_group(state.running.items())
    rate_used = rules.rate_used(state.now, state.windows)
    ready, held = [0] * n, [0] * n
    paused_held = {p.id: 0 for p in pauses}
    for count in queued:
        component, deployment, due = count.component, count.deployment_id, count.ready
        pause = pause_of(pauses, component, deployment or None)
        if pause is not None:
            paused_held[pause.id] += due
            continue
        i = rules.group_of(component)
        if i is None:
            continue
        ready[i] += due
        if due and limit_hold(rules, component, state) is not None:
            held[i] += due
    at_cap = _keys_at_cap(rules, state)
    groups = [
        GroupUse(
            rule=g,
            running=running[i],
            rate_used=rate_used[i],
            rate_window_ends=(
                rate_window(state.now, g.rate[1]) + g.rate[1] if g.rate is not None else None
            ),
            keys_at_cap=at_cap[i],
            ready=ready[i],
            held=held[i],
        )
        for i, g in enumerate(rules.groups)
    ]
    return groups, [PauseUse(pause=p, held=paused_held[p.id]) for p in pauses]
