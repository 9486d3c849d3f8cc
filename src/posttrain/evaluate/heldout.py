"""Held-out sets that say what they are: distinct tasks, versioned, stored with the run.

Invariant: a `HeldoutSet` names every item by (domain, level, sample index)
together with the domain's task-set version and the eval seed, so
`tasks()` rebuilds exactly the items it was built from; no two items of one
domain's set share a normalised prompt, so `n` is the number of distinct
tasks; a domain whose eval split holds fewer distinct tasks than asked gets
the real number and a warning, never repeats.

Sets come in kinds: `core` (the trained level, compared before/after and
across runs), `above` (one level above the trained one) and `transfer`
(families never trained on), the generalisation probes reported apart.
A rotation slice (`rotation_slice`) draws fresh distinct items per
evaluation from a seeded region of the index space, none equal to a core item.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from posttrain.configs import read_json
from posttrain.domains.base import stable_hash
from posttrain.domains.hygiene import prompt_key
from posttrain.errors import ConfigError, TaskError
from posttrain.types import Task

FORMAT_VERSION = 1
Kind = Literal["core", "above", "transfer", "rotation"]
_ROTATION_SPACE = 10**12


@dataclass(frozen=True)
class DomainSet:
    """The held-out items of one domain at one level."""

    domain: str
    level: int
    kind: Kind
    requested: int
    indices: tuple[int, ...]
    taskset_version: str

    @property
    def n(self) -> int:
        return len(self.indices)

    @property
    def short(self) -> bool:
        """The eval split holds fewer distinct tasks than were asked for."""
        return self.n < self.requested

    def tasks(self) -> list[Task]:
        from posttrain.domains.registry import get

        domain = get(self.domain)
        if domain.taskset_version != self.taskset_version:
            raise TaskError(
                f"held-out set of {self.domain}: it was built from task-set version {self.taskset_version}, "
                f"the registered domain is {domain.taskset_version}; the same items cannot be rebuilt"
            )
        return [domain.sample(i, "eval", self.level) for i in self.indices]

    def head(self, m: int) -> DomainSet:
        """The first m items (the fixed subset evaluated during training)."""
        return DomainSet(
            self.domain, self.level, self.kind, min(self.requested, m), self.indices[:m], self.taskset_version
        )


@dataclass(frozen=True)
class HeldoutSet:
    """Every held-out item of a run: the core sets and the generalisation probes."""

    seed: int
    sets: Mapping[str, DomainSet] = field(default_factory=dict)
    """Keyed `kind:domain` (`core:add`, `above:add`, `transfer:mul`)."""

    def of_kind(self, kind: Kind) -> dict[str, DomainSet]:
        return {s.domain: s for s in self.sets.values() if s.kind == kind}

    @property
    def version(self) -> str:
        """One hash of every item: two sets with the same version hold the same items."""
        return f"{stable_hash(json.dumps(self.to_json()['sets'], sort_keys=True)):016x}"[:12]

    def warnings(self) -> list[str]:
        return [
            f"held-out {s.kind} set of {s.domain} (level {s.level}) holds {s.n} distinct tasks, "
            f"{s.requested} were asked for: its eval split has no more"
            for s in self.sets.values()
            if s.short
        ]

    def to_json(self) -> dict:
        return {
            "format": FORMAT_VERSION,
            "seed": self.seed,
            "sets": {
                key: {
                    "domain": s.domain,
                    "level": s.level,
                    "kind": s.kind,
                    "requested": s.requested,
                    "taskset_version": s.taskset_version,
                    "indices": list(s.indices),
                }
                for key, s in self.sets.items()
            },
        }

    @classmethod
    def from_json(cls, data: Mapping) -> HeldoutSet:
        if not isinstance(data, Mapping) or data.get("format") != FORMAT_VERSION:
            raise ConfigError(f"held-out set: expected a mapping with format {FORMAT_VERSION}")
        try:
            sets = {
                key: DomainSet(
                    s["domain"],
                    int(s["level"]),
                    s["kind"],
                    int(s["requested"]),
                    tuple(int(i) for i in s["indices"]),
                    s["taskset_version"],
                )
                for key, s in data["sets"].items()
            }
            seed = int(data["seed"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"held-out set is malformed: {exc!r}") from None
        return cls(seed, sets)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({**self.to_json(), "version": self.version}, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> HeldoutSet:
        p = Path(path)
        if p.is_dir():
            p = p / "heldout.json"
        if not p.is_file():
            raise ConfigError(f"held-out set {str(p)!r} does not exist")
        return cls.from_json(read_json(p))


def distinct_indices(
    domain: str, level: int, n: int, start: int = 0, avoid: Iterable[str] = (), patience: int | None = None
) -> tuple[int, ...]:
    """Indices of up to `n` eval tasks with distinct normalised prompts, scanning from
    `start`; stops after `patience` indices in a row bring nothing new (the split is
    exhausted) or when the domain has no task at an index. Prompts in `avoid` are skipped."""
    from posttrain.domains.registry import get

    dom = get(domain)
    seen, out = set(avoid), []
    patience = patience if patience is not None else max(64, 4 * n)
    misses, i = 0, start
    while len(out) < n and misses < patience:
        try:
            task = dom.sample(i, "eval", level)
        except (IndexError, TaskError):
            break
        key = prompt_key(task)
        if key in seen:
            misses += 1
        else:
            seen.add(key)
            out.append(i)
            misses = 0
        i += 1
    return tuple(out)


def domain_set(domain: str, level: int, n: int, kind: Kind, seed: int = 0) -> DomainSet:
    from posttrain.domains.registry import get

    start = 0 if seed == 0 else stable_hash("eval-core", seed, domain, level) % _ROTATION_SPACE
    return DomainSet(domain, level, kind, n, distinct_indices(domain, level, n, start), get(domain).taskset_version)


def build_heldout(
    levels: Mapping[str, int],
    tasks_per_domain: int,
    seed: int = 0,
    above_tasks: int = 0,
    transfer: Mapping[str, int] | None = None,
) -> HeldoutSet:
    """The core set of each trained domain at its level, one level above it where the
    domain has one (`above_tasks` > 0), and the transfer families at their levels."""
    from posttrain.domains.registry import get

    sets: dict[str, DomainSet] = {}
    for name, level in levels.items():
        sets[f"core:{name}"] = domain_set(name, level, tasks_per_domain, "core", seed)
        if above_tasks and level < get(name).levels:
            sets[f"above:{name}"] = domain_set(name, level + 1, above_tasks, "above", seed)
    for name, level in (transfer or {}).items():
        if name in levels:
            raise ConfigError(f"eval.transfer_domains: {name!r} is trained on, so it cannot measure transfer")
        sets[f"transfer:{name}"] = domain_set(name, level, above_tasks or tasks_per_domain, "transfer", seed)
    return HeldoutSet(seed, sets)


def rotation_slice(core: DomainSet, n: int, rotation: int, seed: int = 0) -> DomainSet:
    """Rotation slice number `rotation` of a core set: up to n distinct eval tasks from a
    seeded region of the index space, none equal to a core item (a small eval split may
    have none left: the slice is then empty and says so)."""
    core_keys = {prompt_key(t) for t in core.tasks()}
    start = stable_hash("eval-rotation", seed, core.domain, core.level, rotation) % _ROTATION_SPACE + _ROTATION_SPACE
    idx = distinct_indices(core.domain, core.level, n, start, avoid=core_keys, patience=max(32, 2 * n))
    return DomainSet(core.domain, core.level, "rotation", n, idx, core.taskset_version)
