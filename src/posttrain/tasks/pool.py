"""TaskPool: draws training tasks by domain weight, temperature and curriculum.

Invariant: `draw` is a pure function of (config, seed, history): the history
is the draws and observations made so far, all of it held in `state_dict()`,
so a pool restored from a state draws exactly the tasks the original would
have drawn next. A drawn task is always from the train split, and carries a
task-set version that hashes its domain's generator version, the pool's
config and its seed. With `tasks.branch` on, up to a share of each draw comes
from the queue of tasks derived from the policy's own failed turns
(tasks/branch.py: train tasks too, rebuilt from the state on resume).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from posttrain.configs.tasks import DomainSpec, TasksConfig
from posttrain.domains.base import Domain, domain_budget, stable_hash, stable_rng
from posttrain.domains.hygiene import prompt_key
from posttrain.errors import TaskError
from posttrain.rollout import Rollout
from posttrain.tasks.branch import BranchQueue
from posttrain.tasks.curriculum import Curriculum
from posttrain.tasks.drift import DriftGuard
from posttrain.types import Task

STATE_VERSION = 1
_INDEX_SPACE = 10**12


def _is_pattern(name: str) -> bool:
    return any(c in name for c in "*?[")


def resolve_specs(config: TasksConfig) -> dict[str, tuple[Domain, DomainSpec]]:
    """The registered domains the config names, each with its spec. A key may
    be a glob pattern (`rg_*`, `*`) matching registered names, evaluation-only ones
    (benchmarks, `Domain.trains` False) left out; an explicit name overrides a
    pattern's spec. An unknown name, a pattern matching nothing or a bad fixed
    difficulty raises TaskError naming it."""
    from posttrain.byo.build import register_sources
    from posttrain.domains.registry import all_domains, get

    register_sources(config)  # file and data-set domains (tasks.domains.NAME.source) join the registry
    specs: dict[str, DomainSpec] = {}
    for key, spec in sorted(config.domains.items(), key=lambda kv: not _is_pattern(kv[0])):
        if _is_pattern(key):
            matched = [n for n, d in all_domains().items() if d.trains and fnmatch.fnmatchcase(n, key)]
            if not matched:
                raise TaskError(f"tasks.domains: pattern {key!r} matches no registered domain")
            specs.update({name: spec for name in matched})
        else:
            get(key)  # raises TaskError with close matches
            specs[key] = spec
    out: dict[str, tuple[Domain, DomainSpec]] = {}
    for name, spec in sorted(specs.items()):
        domain = get(name)
        if spec.difficulty is not None and not 1 <= spec.difficulty <= domain.levels:
            if _is_pattern_source(config, name):
                spec = spec.model_copy(update={"difficulty": domain.levels})
            else:
                raise TaskError(f"tasks.domains.{name}.difficulty must be in 1..{domain.levels}, got {spec.difficulty}")
        out[name] = (domain, spec)
    return out


def _is_pattern_source(config: TasksConfig, name: str) -> bool:
    """True when `name` got its spec from a pattern (a pattern's fixed difficulty is capped per domain)."""
    return name not in config.domains


def resolve_domains(config: TasksConfig) -> dict[str, Domain]:
    """The registered domains the config names (patterns expanded)."""
    return {name: domain for name, (domain, _) in resolve_specs(config).items()}


class TaskPool:
    """Train-split task source for the loop, with online pass-rate tracking."""

    def __init__(self, config: TasksConfig, seed: int | None = None) -> None:
        self.config = config
        self.seed = config.seed if seed is None else int(seed)
        resolved = resolve_specs(config)
        self.domains = {n: d for n, (d, _) in resolved.items()}
        self.specs = {n: spec for n, (_, spec) in resolved.items()}
        self.names = tuple(self.domains)
        self.curriculum = Curriculum(config.curriculum, {n: d.levels for n, d in self.domains.items()})
        self.drift = DriftGuard(config.drift, self.names)
        # branching off (its default) leaves the hash, and so every task-set version, as before it existed
        dump = config.model_dump_json(exclude={"branch"} if config.branch.share == 0 else None)
        self._config_hash = f"{stable_hash(dump, self.seed):016x}"[:8]
        self._versions = {n: f"{d.taskset_version}.{self._config_hash}" for n, d in self.domains.items()}
        self._weights = {n: tuple(sorted((s.reward_weights or {}).items())) for n, s in self.specs.items()}
        self._draws = 0
        self._drawn = {n: 0 for n in self.names}
        self._credit = {n: 0.0 for n in self.names}
        self._counters: dict[str, int] = {}
        self._duplicates = 0
        self._seen_order: deque[str] = deque()
        self._seen: dict[str, int] = {}
        self._shares: dict[str, float] | None = None  # target_shares, until a weight, boost or domain changes
        self._bases: dict[tuple[str, int], int] = {}  # (domain, level) -> its first task index
        self._stamped: dict[tuple[str, Any], Any] = {}  # (domain, a sampled task's meta) -> the stamped meta
        # each domain's turn budget by the one budget rule (tasks.domains.X.max_turns, else its declaration)
        turns = {n: domain_budget(self.domains[n], s).turns for n, s in self.specs.items()}
        self.branch = BranchQueue(config.branch, self.domains, turns, self._root)
        """Tasks derived from the policy's own failed turns (`tasks.branch`), drawn by `draw`."""

    # ---- the mix -------------------------------------------------------
    def target_shares(self) -> dict[str, float]:
        """Share of draws each domain should get now: (weight x drift boost) ** (1/temperature), normalised.
        Computed again only after what it depends on changed (`set_weight`, `exclude`, `observe_eval`,
        `load_state_dict`: the pool's only ways to change a weight, a boost or the drawable domains)."""
        if self._shares is None:
            temperature = self.config.temperature
            raw = {n: (self.specs[n].weight * self.drift.boost(n)) ** (1.0 / temperature) for n in self.names}
            total = sum(raw.values())
            self._shares = {n: v / total for n, v in raw.items()}
        return dict(self._shares)

    def _pick_domain(self, shares: Mapping[str, float]) -> str:
        # Smooth weighted round-robin: every domain earns its share in credit,
        # the richest goes next and pays one draw. The realised mix tracks the
        # target within one round, and a changed share takes effect at once
        # (no back-pay of a cumulative deficit that would starve the others).
        # Ties go to the smaller seeded hash of (seed, draw), reproducibly.
        credit = self._credit
        for n in self.names:
            credit[n] += shares[n]
        best = max(credit[n] for n in self.names)
        tied = [n for n in self.names if credit[n] == best]
        # the hash is needed only to break a tie (the same pick as max by (credit, -hash))
        name = tied[0] if len(tied) == 1 else min(tied, key=lambda n: stable_hash("tie", self.seed, self._draws, n))
        credit[name] -= 1.0
        return name

    def weight(self, name: str) -> float:
        """The configured weight of a domain in this pool."""
        return self.specs[name].weight

    def set_weight(self, name: str, weight: float) -> None:
        """Change a domain's weight (the monitor's lower_weight action; the
        monitor keeps and re-applies such changes on resume)."""
        if name not in self.specs:
            raise TaskError(f"set_weight: domain {name!r} is not in this pool")
        if not math.isfinite(weight) or weight <= 0:
            raise TaskError(f"set_weight: weight must be a positive finite number, got {weight!r}")
        self.specs[name] = self.specs[name].model_copy(update={"weight": float(weight)})
        self._shares = None

    def exclude(self, name: str) -> None:
        """Take a domain out of the drawable domains for good (the monitor's exclude action,
        applied by the loop). Its counters stay in `state_dict`, so a checkpoint still fits a
        pool of the same config; excluding an excluded domain does nothing."""
        if name not in self.domains:
            raise TaskError(f"exclude: domain {name!r} is not in this pool")
        self.names = tuple(n for n in self.names if n != name)
        self._shares = None

    @property
    def excluded(self) -> tuple[str, ...]:
        """The domains of the config that are no longer drawn."""
        return tuple(n for n in self.domains if n not in self.names)

    def _pick_level(self, name: str) -> int:
        spec = self.specs[name]
        if spec.difficulty is not None:
            return spec.difficulty
        rng = stable_rng("level", self.seed, self._draws, name)
        return self.curriculum.choose(name, rng)

    # ---- drawing -------------------------------------------------------
    def _next_task(self, name: str, level: int) -> Task:
        key = f"{name}|{level}"
        base = self._bases.get((name, level))
        if base is None:
            base = self._bases[(name, level)] = stable_hash("index", self.seed, name, level) % _INDEX_SPACE
        task = None
        for _ in range(self.config.dedupe_attempts):
            count = self._counters.get(key, 0)
            self._counters[key] = count + 1
            task = self.domains[name].sample(base + count, "train", level)
            pkey = prompt_key(task)
            if self.config.dedupe_window == 0 or pkey not in self._seen:
                self._remember(pkey)
                return self._handed(task, base + count, level)
        self._duplicates += 1
        self._remember(prompt_key(task))
        return self._handed(task, base + count, level)

    def _handed(self, task: Task, index: int, level: int) -> Task:
        """`task` stamped, its draw remembered for the tasks the branch queue may derive from it."""
        task = self._stamp(task)
        self.branch.drawn(task, index, level)
        return task

    def _root(self, name: str, index: int, level: int) -> Task:
        """Train task `index` of `name` at `level`, stamped: a derived task's root (the branch queue's rebuild)."""
        return self._stamp(self.domains[name].sample(index, "train", level))

    def _remember(self, pkey: str) -> None:
        if self.config.dedupe_window == 0:
            return
        self._seen_order.append(pkey)
        self._seen[pkey] = self._seen.get(pkey, 0) + 1
        while len(self._seen_order) > self.config.dedupe_window:
            old = self._seen_order.popleft()
            self._seen[old] -= 1
            if not self._seen[old]:
                del self._seen[old]

    def _stamp(self, task: Task) -> Task:
        """The pool's task-set version and the domain's reward weights (which `Domain.score` applies).
        A domain's tasks share a few distinct metas: each stamped once, then shared (they are frozen)."""
        key = (task.domain, task.meta)
        try:
            meta = self._stamped.get(key)
        except TypeError:  # a meta with an unhashable value: stamped every time
            key, meta = None, None
        if meta is None:
            meta = dataclasses.replace(
                task.meta, taskset_version=self._versions[task.domain], reward_weights=self._weights[task.domain]
            )
            if key is not None:
                self._stamped[key] = meta
        return dataclasses.replace(task, meta=meta)

    def draw(self, n: int) -> list[Task]:
        """The next `n` train tasks: fresh ones by target shares and curriculum, then (`tasks.branch`)
        up to floor(share x n) derived from the policy's failed turns, oldest first."""
        if not isinstance(n, int) or n < 0:
            raise TaskError(f"draw: n must be a non-negative int, got {n!r}")
        derived = self.branch.take(n, self.names)
        tasks = []
        for _ in range(n - len(derived)):
            shares = self._shares if self._shares is not None else self.target_shares()
            name = self._pick_domain(shares)
            level = self._pick_level(name)
            tasks.append(self._next_task(name, level))
            self._drawn[name] += 1
            self._draws += 1
        return tasks + derived

    def offer(self, groups: Sequence[Sequence[Rollout]]) -> int:
        """The step's finished groups: tasks derived from their failed episodes join the branch queue
        (`tasks.branch`; nothing when it is off). How many joined."""
        return self.branch.offer(groups)

    # ---- feedback ------------------------------------------------------
    def observe(self, task: Task, reward: float) -> None:
        """Record one train reward (never an infra failure) for the task's domain and level. A derived
        task's (`TaskMeta.branched`) is left out: the curriculum's pass rates are of the domain's own tasks."""
        if task.domain not in self.domains:
            raise TaskError(f"observe: domain {task.domain!r} is not in this pool")
        if task.meta.branched:
            return
        if not isinstance(reward, (int, float)) or not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
            raise TaskError(f"observe: reward must be a finite number in [0, 1], got {reward!r}")
        self.curriculum.observe(task.domain, task.meta.difficulty, float(reward))

    def observe_eval(self, pass_rates: Mapping[str, float], counts: Mapping[str, int] | None = None) -> list[str]:
        """Record one held-out evaluation (domain -> pass rate, and the item count behind each);
        returns the domains the drift guard boosted."""
        unknown = sorted(set(pass_rates) - set(self.domains))
        if unknown:
            raise TaskError(f"observe_eval: domains not in this pool: {', '.join(unknown)}")
        self._shares = None  # the drift guard's boosts may move
        return self.drift.observe(pass_rates, counts)

    def eval_difficulty(self, name: str) -> int:
        """Level the evaluator uses for `name`: the fixed difficulty when set,
        else the hardest level the curriculum has made its frontier (with the
        curriculum off: `eval_default_difficulty`, clipped to the domain's levels)."""
        if name not in self.domains:
            raise TaskError(f"eval_difficulty: domain {name!r} is not in this pool")
        spec = self.specs[name]
        if spec.difficulty is not None:
            return spec.difficulty
        floor = min(self.config.eval_default_difficulty, self.domains[name].levels)
        if not self.config.curriculum.enabled:
            return floor
        return max(floor, self.curriculum.highest_frontier(name))

    # ---- resume --------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-able state for exact resume."""
        return {
            "version": STATE_VERSION,
            "config_hash": self._config_hash,
            "draws": self._draws,
            "drawn": dict(self._drawn),
            "credit": dict(self._credit),
            "counters": dict(self._counters),
            "duplicates": self._duplicates,
            "seen": list(self._seen_order),
            "curriculum": self.curriculum.state_dict(),
            "drift": self.drift.state_dict(),
            "branch": self.branch.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a state from `state_dict` (of a pool with the same domains)."""
        if not isinstance(state, Mapping) or state.get("version") != STATE_VERSION:
            raise TaskError(f"task pool state: expected a mapping with version {STATE_VERSION}")
        try:
            drawn = {str(k): int(v) for k, v in state["drawn"].items()}
            if set(drawn) != set(self.names):
                raise TaskError(
                    f"task pool state: its domains differ from the config's ({sorted(set(drawn) ^ set(self.names))})"
                )
            self._draws = int(state["draws"])
            self._drawn = drawn
            self._credit = {n: float(state.get("credit", {}).get(n, 0.0)) for n in self.names}
            self._counters = {str(k): int(v) for k, v in state["counters"].items()}
            self._duplicates = int(state["duplicates"])
            self._seen_order = deque(str(s) for s in state["seen"])
            self._seen = {}
            for pkey in self._seen_order:
                self._seen[pkey] = self._seen.get(pkey, 0) + 1
            self.curriculum.load_state_dict(state["curriculum"])
            self.drift.load_state_dict(state["drift"])
            self.branch.load_state_dict(state.get("branch"))  # absent: a checkpoint from before branching
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, TaskError):
                raise
            raise TaskError(f"task pool state is malformed: {exc!r}") from exc
        finally:
            self._shares = None  # the drift guard's boosts come from the state

    # ---- reporting -----------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Per-domain realised and target shares, frontier, boost and per-level pass rates."""
        shares = self.target_shares()
        total = max(self._draws, 1)
        per_domain = {
            n: {
                "drawn": self._drawn[n],
                "share": self._drawn[n] / total,
                "target_share": shares[n],
                "boost": self.drift.boost(n),
                **self.curriculum.domain_stats(n),
            }
            for n in self.names
        }
        return {
            "draws": self._draws,
            "duplicates_accepted": self._duplicates,
            "taskset_version": self.taskset_version,
            "domains": per_domain,
            "drift_events": self.drift.events(),
        }

    @property
    def taskset_version(self) -> str:
        """One hash of every domain's generator version, the config and the seed."""
        blob = json.dumps(sorted(self._versions.items()))
        return f"{stable_hash(blob):016x}"[:12]
