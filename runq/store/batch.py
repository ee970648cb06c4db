"""Engine-neutral planning of ``Store.submit_batch``: which items insert a run, which answer
with a run that exists already, and whether the queue has room for the new ones.

A batch follows the single submit's rules item by item, in order, inside one transaction:
a unique key that holds answers with its run, then an idempotency key already used by the
same user answers with its run (another component: ``IdempotencyConflict`` for the whole
batch). A key seen earlier *in the same batch* answers with that earlier item's run, as a
second single submit right after the first would. The depth gates then count the runs the
batch would add on top of those queued: the whole batch fits, or nothing is stored (a
single submit is refused at ``limit`` queued runs; a batch when ``queued + new > limit``).

Everything here is linear in the batch (dict lookups), so a batch of thousands plans in
milliseconds; the engines supply the lookups (stored keys, held unique keys) and counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from runq.errors import IdempotencyConflict, QueueFull
from runq.ids import new_run_ids
from runq.model import NewRun, Status
from runq.store import messages

#: (idempotency key, user id or "") → (stored run id, its "type/id" component).
StoredKeys = Mapping[tuple[str, str], tuple[str, str]]
#: (component, unique key) → the id of the stored run that key holds now.
HeldUnique = Mapping[tuple[str, str], str]


def run_ids(news: Sequence[NewRun]) -> list[str]:
    """Each item's id: its own (tests, imports) or a new one, all made in one go."""
    made = iter(new_run_ids(sum(1 for n in news if not n.id)))
    return [n.id or next(made) for n in news]


def component_of(new: NewRun) -> str:
    return f"{new.component_type}/{new.component_id}"


def idempotency_slot(new: NewRun) -> tuple[str, str] | None:
    """The (key, user) an idempotency key is unique within, or None without a key."""
    if new.idempotency_key is None:
        return None
    return new.idempotency_key, new.actor.user_id or ""


def insert_order(news: Sequence[NewRun], positions: Iterable[int]) -> list[int]:
    """``positions`` in the order a batch inserts them: runs with an idempotency key first,
    by (key, user), then the rest as given. Two batches that share keys then wait for each
    other's keys in one order, never crosswise (a deadlock of the unique index)."""
    keyed: list[int] = []
    plain: list[int] = []
    for i in positions:
        (plain if news[i].idempotency_key is None else keyed).append(i)
    keyed.sort(key=lambda i: idempotency_slot(news[i]) or ("", ""))
    return keyed + plain


def unique_slot(new: NewRun) -> tuple[str, str] | None:
    return None if new.unique is None else (component_of(new), new.unique.key)


@dataclass(slots=True)
class BatchPlan:
    """``answer[i]``: an ``int`` is the index of the batch item whose new run answers item
    ``i`` (``i`` itself when item ``i`` inserts); a ``str`` is a stored run's id."""

    answer: list[int | str] = field(default_factory=list)

    @property
    def fresh(self) -> list[int]:
        """Indexes of the items that insert a run, in batch order."""
        return [i for i, a in enumerate(self.answer) if a == i]

    @property
    def stored_ids(self) -> set[str]:
        return {a for a in self.answer if isinstance(a, str)}

    def created(self, index: int) -> bool:
        return self.answer[index] == index


def plan_batch(news: Sequence[NewRun], stored: StoredKeys, held: HeldUnique) -> BatchPlan:
    """Decide each item's answer in order (see the module docstring)."""
    if not stored and not held and not any(n.idempotency_key or n.unique for n in news):
        return BatchPlan(list(range(len(news))))  # no keys: every item inserts its own run
    plan = BatchPlan()
    by_unique: dict[tuple[str, str], int | str] = {}
    by_key: dict[tuple[str, str], tuple[int | str, str]] = {}
    for index, new in enumerate(news):
        answer = _answer_of(new, index, stored, held, by_unique, by_key)
        plan.answer.append(answer)
        uslot, kslot = unique_slot(new), idempotency_slot(new)
        if uslot is not None and uslot not in by_unique:
            # A run this batch inserts is queued, so it holds its key only where the
            # unique states count queued runs (the default: every status).
            assert new.unique is not None
            if answer != index or Status.QUEUED in new.unique.states:
                by_unique[uslot] = answer
        if kslot is not None and kslot not in by_key and answer == index:
            by_key[kslot] = (answer, component_of(new))
    return plan


def _answer_of(
    new: NewRun,
    index: int,
    stored: StoredKeys,
    held: HeldUnique,
    by_unique: dict[tuple[str, str], int | str],
    by_key: dict[tuple[str, str], tuple[int | str, str]],
) -> int | str:
    uslot = unique_slot(new)
    if uslot is not None:
        earlier = by_unique.get(uslot)
        if earlier is not None:
            return earlier
        if uslot in held:
            return held[uslot]
    kslot = idempotency_slot(new)
    if kslot is None:
        return index
    found = by_key.get(kslot) or stored.get(kslot)
    if found is None:
        return index
    answer, component = found
    if component != component_of(new):
        raise IdempotencyConflict(messages.idempotency_conflict(kslot[0], component))
    return answer


@dataclass(frozen=True, slots=True)
class DepthLimits:
    """The gates of ``Store.submit`` (0 = unbounded)."""

    max_queue_depth: int
    max_delayed: int
    max_queued_per_user: int


@dataclass(frozen=True, slots=True)
class Gate:
    """One depth gate the batch adds ``adding`` runs to: ``kind`` is "due", "delayed" or
    "user" (of ``user``). The engine counts the queued runs of that kind up to ``limit`` (a
    bounded walk, as submit's gates) and calls ``check``."""

    kind: str
    user: str
    adding: int
    limit: int

    def check(self, queued: int) -> None:
        if queued + self.adding > self.limit:
            raise QueueFull(messages.batch_too_big(self.kind, queued, self.adding, self.limit))


def gates(news: Sequence[NewRun], plan: BatchPlan, limits: DepthLimits) -> list[Gate]:
    """The gates the new runs of the batch must fit (only the bounded ones they add to)."""
    due = delayed = 0
    per_user: dict[str, int] = {}
    for i in plan.fresh:
        new = news[i]
        if new.delay_seconds > 0:
            delayed += 1
        else:
            due += 1
        if new.actor.user_id:
            per_user[new.actor.user_id] = per_user.get(new.actor.user_id, 0) + 1
    found: list[Gate] = []
    if delayed and limits.max_delayed > 0:
        found.append(Gate("delayed", "", delayed, limits.max_delayed))
    if due and limits.max_queue_depth > 0:
        found.append(Gate("due", "", due, limits.max_queue_depth))
    if limits.max_queued_per_user > 0:
        limit = limits.max_queued_per_user
        found += [Gate("user", user, n, limit) for user, n in per_user.items()]
    return found
