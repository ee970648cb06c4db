"""Fleet-wide settings the live workers disagree on (``runq status``, ``/queue/stats`` and
the exporter's gauge): each worker records the settings it runs with when it registers."""

from __future__ import annotations

from collections.abc import Iterable

from runq.model import SettingDivergence, SettingValue, WorkerInfo


def fleet_divergences(workers: Iterable[WorkerInfo]) -> list[SettingDivergence]:
    """Each recorded setting with more than one value among ``workers`` (pass live ones
    only: a dead worker's row says nothing about the fleet now), by setting name, values
    ascending. Workers that recorded no settings are left out."""
    by_setting: dict[str, dict[float, list[str]]] = {}
    for worker in workers:
        for name, value in worker.settings.items():
            by_setting.setdefault(name, {}).setdefault(value, []).append(worker.id)
    return [
        SettingDivergence(
            setting=name,
            values=[SettingValue(value=v, workers=sorted(ids)) for v, ids in sorted(seen.items())],
        )
        for name, seen in sorted(by_setting.items())
        if len(seen) > 1
    ]
