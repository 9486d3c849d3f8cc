"""Branching: tasks derived from the policy's own failed turns, queued for the task pool (`tasks.branch`).

A multi-turn domain's revision turn gets almost no GRPO signal from whole episodes: a group of G
episodes rarely holds a failed first turn followed by a differing second one. Branching (as SCoRe,
Kumar et al. 2024, and turn-level branching in multi-turn GRPO) trains the revision on the
policy's own failed attempts: an episode that ended failed after a failing non-final turn gives a
derived task whose prompt is the episode up to that turn's observation (the domain's
`branch_at` says which turn, its `branched` builds the task), and the pool draws it later as a
group of its own, so GRPO compares G revisions of one failure.

Invariants: a task is derived only from a training episode (split train) that was scored and
did not pass; a masked episode (an infra error) never gives one. A derived task keeps its root
task's split and reference (the same verifier decides) and is never an eval task. Its turn budget
is its domain's less the turns in its prompt (`TaskMeta.branched`), and a task is derived only
when at least one turn is left, so a derived task of a derived task is bounded by the domain's
turn budget. The queue is a pure function of the groups offered to it, and its state
(`state_dict`: each entry's root draw and turns, JSON) rebuilds the same tasks, so a resumed run
draws what the uninterrupted one would have.

With `baseline: fresh` a derived task carries `TaskMeta.baseline`: the reward a fresh first
attempt earned in the group the failure came from (`fresh_reward`), which the trainer judges the
revisions against instead of their own mean (trainer/trainer.py `_prepare`).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from posttrain.configs.tasks import BranchConfig
from posttrain.domains.base import Domain
from posttrain.errors import TaskError
from posttrain.rollout import Rollout
from posttrain.types import Task

ORIGINS_KEPT = 8192
"""How many drawn tasks' origins the queue remembers (enough for every group in flight: a group
is offered within its staleness bound of its draw)."""


@dataclass(frozen=True)
class Origin:
    """How to rebuild a task: its root draw (domain, task index, level: `Domain.sample(index,
    "train", level)`, stamped by the pool), the turns each derivation added, in order, and the
    last derivation's baseline (`TaskMeta.baseline`; None under `baseline: group`)."""

    domain: str
    index: int
    level: int
    segments: tuple[tuple[tuple[str, str], ...], ...] = ()
    baseline: float | None = None

    def to_json(self) -> list[Any]:
        row = [self.domain, self.index, self.level, [[list(t) for t in seg] for seg in self.segments]]
        return row if self.baseline is None else [*row, self.baseline]

    @classmethod
    def from_json(cls, row: Sequence[Any]) -> Origin:
        domain, index, level, segments, *rest = row  # a checkpoint from before baselines: 4 fields
        if len(rest) > 1:
            raise ValueError(f"an origin has 4 or 5 fields, got {len(row)}")
        segs = tuple(tuple((str(a), str(o)) for a, o in seg) for seg in segments)
        return cls(str(domain), int(index), int(level), segs, float(rest[0]) if rest else None)


def fresh_reward(group: Sequence[Rollout]) -> float | None:
    """What a fresh first attempt earned in `group`: the mean training reward of its scored episodes,
    each episode that did not end at its first turn counted 0 (a first attempt that failed its
    environment's check; its own reward was never taken). None when no episode was scored."""
    scored = [r for r in group if r.train_reward is not None and r.error_kind is None]
    if not scored:
        return None
    return sum(r.train_reward for r in scored if len(r.turns) == 1) / len(scored)  # type: ignore[misc]


def with_baseline(task: Task, baseline: float | None) -> Task:
    """`task` judged against `baseline` (`TaskMeta.baseline`); None: its group's own mean."""
    return task if baseline is None else replace(task, meta=replace(task.meta, baseline=baseline))


class BranchQueue:
    """The pool's queue of derived tasks (owned by `TaskPool`): `offer` the step's groups, `take`
    up to a share of each draw, `state_dict` for checkpoints, `row` for the metrics line."""

    def __init__(
        self,
        config: BranchConfig,
        domains: Mapping[str, Domain],
        turns: Mapping[str, int],
        root: Callable[[str, int, int], Task],
    ) -> None:
        self.config = config
        self.domains = domains
        self.turns = turns
        """Each domain's effective turn budget (its declaration or tasks.domains.X.max_turns)."""
        self._root = root  # (domain, index, level) -> the pool's stamped task
        self._queue: deque[tuple[Task, Origin]] = deque()
        self._origins: OrderedDict[str, Origin] = OrderedDict()
        self.counts: Counter[str] = Counter()
        """Over the run: derived, drawn, pushed out (past max_queue), and refused by cause."""

    @property
    def on(self) -> bool:
        return self.config.share > 0 and any(d.branches for d in self.domains.values())

    def __len__(self) -> int:
        return len(self._queue)

    # ---- the pool's side -------------------------------------------------
    def drawn(self, task: Task, index: int, level: int) -> None:
        """The pool handed out `task`, its domain's train task `index` at `level`: remembered so
        a derived task of it can be rebuilt (bounded: `ORIGINS_KEPT`)."""
        if self.on:
            self._remember(task.id, Origin(task.domain, index, level))

    def take(self, n: int, drawable: Collection[str]) -> list[Task]:
        """Up to floor(share x n) derived tasks, oldest first (fewer when the queue holds fewer); a
        queued task whose domain is no longer `drawable` (the monitor excluded it) is dropped, counted."""
        k = int(self.config.share * n) if self.on else 0
        out: list[Task] = []
        while self._queue and len(out) < k:
            task, origin = self._queue.popleft()
            if task.domain not in drawable:
                self.counts["excluded"] += 1
                continue
            self._remember(task.id, origin)
            out.append(task)
        self.counts["drawn"] += len(out)
        return out

    # ---- the loop's side -------------------------------------------------
    def offer(self, groups: Sequence[Sequence[Rollout]]) -> int:
        """Derive tasks from the failed episodes of `groups` (at most `per_group` a group) and queue
        them, each task once (the same failed turns of the same task, already queued: counted as a
        duplicate); returns how many were queued."""
        if not self.on:
            return 0
        queued = 0
        for group in groups:
            made = 0
            fresh = fresh_reward(group) if self.config.baseline == "fresh" else None
            for r in group:
                if made >= self.config.per_group:
                    break
                derived = self._derive(r, fresh)
                if derived is None:
                    continue
                if any(t.id == derived[0].id for t, _ in self._queue):
                    self.counts["duplicate"] += 1
                    continue
                self._push(*derived)
                made += 1
                queued += 1
        return queued

    def _derive(self, r: Rollout, baseline: float | None = None) -> tuple[Task, Origin] | None:
        domain = self.domains.get(r.task.domain)
        if domain is None or not domain.branches or r.task.meta.split != "train" or not r.turns:
            return None
        if r.score is None or r.error_kind is not None:  # blame by cause: an infra error is never data
            self.counts["refused_masked"] += 1
            return None
        if r.score.passed:
            return None
        k = domain.branch_at(r.task, r.turns)
        if k < 1:
            return None
        if r.task.meta.branched + k >= self.turns[r.task.domain] or k >= len(r.turns):
            self.counts["refused_budget"] += 1  # no turn would be left to revise in
            return None
        parent = self._origins.get(r.task.id)
        if parent is None:  # drawn before this process remembered it (cannot be rebuilt on resume)
            self.counts["refused_unknown"] += 1
            return None
        segment = tuple((t.action, t.observation) for t in r.turns[:k])
        origin = Origin(parent.domain, parent.index, parent.level, (*parent.segments, segment), baseline)
        self.counts["derived"] += 1
        return with_baseline(domain.branched(r.task, segment), baseline), origin

    def _push(self, task: Task, origin: Origin) -> None:
        self._queue.append((task, origin))
        while len(self._queue) > self.config.max_queue:
            self._queue.popleft()
            self.counts["pushed_out"] += 1

    def _remember(self, task_id: str, origin: Origin) -> None:
        self._origins[task_id] = origin
        self._origins.move_to_end(task_id)
        while len(self._origins) > ORIGINS_KEPT:
            self._origins.popitem(last=False)

    def rebuild(self, origin: Origin) -> Task:
        """The task `origin` describes: its root draw, then each derivation in order."""
        task = self._root(origin.domain, origin.index, origin.level)
        for segment in origin.segments:
            task = self.domains[origin.domain].branched(task, segment)
        return with_baseline(task, origin.baseline)

    # ---- checkpoints and metrics -----------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The queued tasks as their origins (JSON), and the counts."""
        return {"queue": [o.to_json() for _, o in self._queue], "counts": dict(self.counts)}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Restore `state_dict`'s queue (each task rebuilt from its origin); None or {}: empty (a
        checkpoint from before branching)."""
        state = state or {}
        try:
            origins = [Origin.from_json(row) for row in state.get("queue", [])]
            unknown = sorted({o.domain for o in origins} - set(self.domains))
            if unknown:
                raise TaskError(f"task pool state: derived tasks of domains not in this pool: {unknown}")
            self._queue = deque((self.rebuild(o), o) for o in origins)
            self.counts = Counter({str(k): int(v) for k, v in state.get("counts", {}).items()})
        except (KeyError, TypeError, ValueError) as exc:
            raise TaskError(f"task pool state: its branch queue is malformed: {exc!r}") from exc

    def row(self) -> dict[str, Any]:
        """The metrics line's view: queue length and the run's counts (`branch_*`; empty when off)."""
        if not self.on:
            return {}
        return {"branch_queue": len(self._queue), **{f"branch_{k}": v for k, v in sorted(self.counts.items())}}
