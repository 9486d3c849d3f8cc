"""The replay buffer: groups trained on at one loop step, trained on again at later steps.

Invariant: the buffer never holds more than `capacity` groups, nor one sampled more than
`max_age` steps before the step that takes it, nor one replayed `max_replays` times; what it
holds (rows with their behaviour log-probs, the step that sampled them, their replay counts) and
what it has counted are JSON (`state_dict`), so a resumed run takes the same replays. The choice
of what a step replays is deterministic (least replayed first, then most recently sampled), so
no random state needs saving. Torch-free: the loop builds the rows (`trainer.batch.TrainRow`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from posttrain.configs.trainer import ReplayConfig
from posttrain.rollout import Rollout
from posttrain.trainer.batch import TrainRow


@dataclass(frozen=True)
class ReplayEntry:
    """One group in the buffer: its rows as they were trained at `step` (the loop step that
    sampled them), where it came from, and how often it has been replayed."""

    group_id: str
    domain: str
    task_id: str
    step: int
    rows: tuple[TrainRow, ...]
    replays: int = 0

    def age(self, step: int) -> int:
        """Loop steps between the step that sampled the group and `step`."""
        return step - self.step

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "rows": [asdict(r) for r in self.rows]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReplayEntry:
        rows = tuple(
            TrainRow(
                **{**r, **{k: tuple(r[k]) for k in ("prompt_ids", "completion_ids", "behaviour_logprobs", "loss_mask")}}
            )
            for r in data["rows"]
        )
        return cls(data["group_id"], data["domain"], data["task_id"], int(data["step"]), rows, int(data["replays"]))


def admits(cfg: ReplayConfig, group: Sequence[Rollout]) -> bool:
    """Whether a trained group enters the buffer: its scored rewards not all equal, its domain
    among `cfg.domains` (when set) and, for admit "rare", at most `cfg.rare_share` of its scored
    samples passed."""
    scored = [r for r in group if r.score is not None]
    if len({r.score.value for r in scored if r.score is not None}) < 2:
        return False
    if cfg.domains and group[0].task.domain not in cfg.domains:
        return False
    if cfg.admit == "mixed":
        return True
    passed = sum(bool(r.score.passed) for r in scored if r.score is not None)
    return 0 < passed <= cfg.rare_share * len(scored)


class ReplayBuffer:
    """A bounded buffer of past groups; `admit` after a step that applied its update, `take`
    before a step trains."""

    def __init__(self, cfg: ReplayConfig, prompts_per_step: int) -> None:
        self.cfg = cfg
        self.per_step = max(1, round(cfg.share * prompts_per_step))
        """Groups a step replays when the buffer holds that many."""
        self.entries: list[ReplayEntry] = []
        self.counts = {"admitted": 0, "replayed": 0, "evicted_age": 0, "evicted_capacity": 0, "evicted_used": 0}
        """Totals over the run (carried across a resume)."""

    def admit(self, groups: Sequence[tuple[Sequence[Rollout], tuple[TrainRow, ...]]], step: int) -> int:
        """Keep the groups (each with its rows as step `step` trained them) that `admits`; the
        oldest entries go when the buffer is over capacity. Returns how many entered."""
        entered = 0
        for group, rows in groups:
            if rows and admits(self.cfg, group):
                task = group[0].task
                self.entries.append(ReplayEntry(group[0].group_id, task.domain, task.id, step, rows))
                entered += 1
        self.counts["admitted"] += entered
        over = len(self.entries) - self.cfg.capacity
        if over > 0:
            self.entries.sort(key=lambda e: e.step)  # stable: among equal steps, first admitted first
            del self.entries[:over]
            self.counts["evicted_capacity"] += over
        return entered

    def take(self, step: int) -> list[ReplayEntry]:
        """The entries loop step `step` replays (each as it was before this replay), after
        evicting those older than max_age; an entry replayed max_replays times leaves."""
        fresh = [e for e in self.entries if e.age(step) <= self.cfg.max_age]
        self.counts["evicted_age"] += len(self.entries) - len(fresh)
        order = sorted(range(len(fresh)), key=lambda i: (fresh[i].replays, -fresh[i].step, i))
        chosen = set(order[: self.per_step])
        taken, kept = [], []
        for i, entry in enumerate(fresh):
            if i not in chosen:
                kept.append(entry)
                continue
            taken.append(entry)
            used = replace(entry, replays=entry.replays + 1)
            if used.replays < self.cfg.max_replays:
                kept.append(used)
            else:
                self.counts["evicted_used"] += 1
        self.entries = kept
        self.counts["replayed"] += len(taken)
        return taken

    def __len__(self) -> int:
        return len(self.entries)

    def state_dict(self) -> dict[str, Any]:
        return {"entries": [e.to_json() for e in self.entries], "counts": dict(self.counts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.entries = [ReplayEntry.from_json(e) for e in state["entries"]]
        self.counts = {**self.counts, **{k: int(v) for k, v in state["counts"].items()}}

    def close(self) -> None:
        """Nothing to release."""
