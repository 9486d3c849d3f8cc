"""The replay buffer: groups trained on at one loop step, trained on again at later steps.

Invariant: the buffer never holds more than `capacity` groups, nor one sampled more than
`max_age` steps before the step that takes it, nor one replayed `max_replays` times; what it
holds (rows with their behaviour log-probs, the step that sampled them, their replay counts) and
what it has counted are JSON (`state_dict`), so a resumed run takes the same replays. The choice
of what a step replays is deterministic (least replayed first, then most recently sampled), so
no random state needs saving. Torch-free. After each train step the loop hands the buffer the
step (`after_step`): its replays become one `replay` trace event, the kept groups of a step that
applied its update enter, and the metrics row gets the replay figures.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from posttrain.configs.trainer import ReplayConfig
from posttrain.rollout import Rollout
from posttrain.trace import TraceStore
from posttrain.trainer.batch import RolloutLink, TrainRow, rows_of

if TYPE_CHECKING:
    from posttrain.trainer.trainer import StepStats


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


def replay_buffer(cfg: ReplayConfig, prompts_per_step: int, state: dict[str, Any] | None) -> ReplayBuffer | None:
    """trainer.replay's buffer (None when off), with the checkpoint's contents (`state`) on resume."""
    if not cfg.enabled:
        return None
    buffer = ReplayBuffer(cfg, prompts_per_step)
    if state is not None:
        buffer.load_state_dict(state)
    return buffer


class ReplayBuffer:
    """A bounded buffer of past groups; `take` before a step trains, `after_step` (which admits)
    after it."""

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

    def after_step(
        self,
        trace: TraceStore,
        step: int,
        kept: Sequence[Sequence[Rollout]],
        replays: Sequence[ReplayEntry],
        stats: StepStats | None,
        temperature: float,
        entropy_coef: Callable[[str], float] | None = None,
    ) -> dict[str, Any]:
        """After loop step `step`'s train step (`stats`, None when nothing was trained): its
        `replays` as a `replay` trace event (`replay_event`), then the `kept` groups of a step
        that applied its update enter the buffer (their rows as `rows_of` makes them). Returns
        the metrics row's replay figures: replayed groups and rows, their share of the step's
        batch rows, their age (loop steps since sampled), ratio to the behaviour log-probs and
        clipped share (means over the replayed rows that entered the loss), what entered, and
        the buffer's size and totals."""
        links = stats.rollouts if stats is not None else {}
        if replays:
            replay_event(trace, step, replays, links, stats.outcome if stats is not None else "no_signal")
        applied = stats is not None and stats.outcome == "applied"
        admitted = self.admit([(g, rows_of(g, temperature, entropy_coef)) for g in kept if g], step) if applied else 0
        rows = [row for e in replays for row in e.rows]
        used = [links[r.rollout_id] for r in rows if r.rollout_id in links and links[r.rollout_id].ratio is not None]
        ages = [e.age(step) for e in replays]
        n_rows = stats.n_rows if stats is not None else 0
        return {
            "replay_groups": len(replays),
            "replay_rows": len(rows),
            "replay_share": round(len(rows) / n_rows, 4) if n_rows else 0.0,
            "replay_age_mean": round(sum(ages) / len(ages), 3) if ages else 0.0,
            "replay_age_max": max(ages, default=0),
            "replay_ratio_mean": round(sum(lk.ratio for lk in used) / len(used), 5) if used else 1.0,
            "replay_clipped": round(sum(lk.clipped for lk in used) / len(used), 5) if used else 0.0,
            "replay_admitted": admitted,
            "replay_buffer": len(self),
            **{f"replay_{k}_total": v for k, v in self.counts.items()},
        }


def replay_event(
    trace: TraceStore, step: int, replays: Sequence[ReplayEntry], links: Mapping[str, RolloutLink], outcome: str
) -> None:
    """One `replay` trace event for the step: per replayed group its id, the draw it was made from
    (whose fate stays the one it had), the step that sampled it, its age and replay count, and per
    rollout the advantage, ratio and clipped share this step's loss saw (None: not in the loss)."""
    groups = [
        {
            "group_id": e.group_id,
            "draw": (trace.draw_of_group(e.group_id) or {}).get("id"),
            "sampled_step": e.step,
            "age": e.age(step),
            "replays": e.replays + 1,
            "rollouts": {r.rollout_id: _link_json(links.get(r.rollout_id)) for r in e.rows},
        }
        for e in replays
    ]
    message = f"{len(replays)} groups replayed ({outcome})"
    trace.add_event("replay", message, step=step, data={"groups": groups, "outcome": outcome})


def _link_json(link: RolloutLink | None) -> dict[str, Any] | None:
    """A trainer link as the replay event stores it (None: the row entered no batch)."""
    return None if link is None else {"advantage": link.advantage, "ratio": link.ratio, "clipped": link.clipped}
