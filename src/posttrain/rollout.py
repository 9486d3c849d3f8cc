"""The record of one scored (or masked) sample, and what makes a group trainable.

Invariant: a Rollout is either scored or masked with a typed error (never
scored 0 for an infra error; a model fault is scored, normally 0, with
`Score.reason` "model fault: ...", and carries no error kind); a group is
trainable only when its scored training rewards are not all equal, and its masked
samples are left out (the trainer's advantages are over the scored ones).
A rollout has its id from birth (`rollout_id`: its group id and its index in
the group, so a resumed run gives the same sample the same id); the trace
row, the trainer's row and the monitor's links carry that id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from posttrain.types import Completion, Image, Score, Task, Turn


@dataclass(frozen=True)
class Rollout:
    task: Task
    completion: Completion
    group_id: str
    score: Score | None
    error_kind: str | None = None
    error: str | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    loss_mask: tuple[int, ...] | None = None
    """Multi-turn episodes: 1 for the model's own tokens, 0 for observations (None: all ones)."""
    exec_result: Any = None
    """What execution produced for the verifier (the execute stage's sandbox result, or
    a multi-turn episode's last turn's)."""
    turns: tuple[Turn, ...] = ()
    """Multi-turn episodes: every turn (action, observation, exec_result, parts), traced."""
    first_observation: str = ""
    """Multi-turn episodes: the environment's first observation (part of the prompt)."""
    retries: int = 0
    """Retries after infra errors before this sample's score or mask: its group's (admission
    stage calls, generation) and its own (execute step, environment step, verification)."""
    diversity_bonus: float | None = None
    """The diversity reward within its group, added to the verifier's reward for training
    (pipeline/countermeasures.py); None: no diversity reward in its domain, or masked."""
    observation_images: tuple[Image, ...] = field(default=(), kw_only=True)
    """Multi-turn episodes: the images environment steps showed that the completion's tokens
    hold, in order (`StepResult.images`); empty for text and single-turn rollouts."""
    id: str = field(kw_only=True)
    """`rollout_id(group_id, index in the group)`: the trace row's id, the trainer row's
    rollout_id, the key of the train step's links."""

    @property
    def prompt_text(self) -> str:
        """What the model was shown before its first turn, as text (the trace's prompt):
        the task's messages (an image named by its size and sha256 digest, `Message.as_text`, never
        its bytes) and, for a multi-turn episode, the first observation."""
        return "\n".join([*(m.as_text() for m in self.task.prompt), *filter(None, [self.first_observation])])

    @property
    def images(self) -> tuple[Image, ...]:
        """Every image of the sampled sequence, in the order of its image-token runs: the task
        prompt's, then the observations' (what the trainer recomputes the pixels from)."""
        return self.task.images + self.observation_images

    @property
    def reward(self) -> float | None:
        """The verifier's reward (None: masked)."""
        return None if self.score is None else self.score.value

    @property
    def train_reward(self) -> float | None:
        """What the trainer's advantages see: the verifier's reward plus the diversity bonus."""
        return None if self.score is None else self.score.value + (self.diversity_bonus or 0.0)


def rollout_id(group_id: str, sample: int) -> str:
    """The id of sample `sample` (its index in the group, from 0) of group `group_id`. Group ids
    are unique over a run (the loop step and the group's place in it: "12:3"), so these are too,
    and a resumed run, which makes the same groups, gives them the same ids."""
    return f"{group_id}/{sample}"


def informative(group: Sequence[Rollout]) -> bool:
    """A group carries signal when its scored training rewards (`Rollout.train_reward`) are not all
    equal, or, for a task judged against a baseline (`TaskMeta.baseline`), when one differs from it."""
    rewards = {r.train_reward for r in group if r.train_reward is not None}
    baseline = group[0].task.meta.baseline if group else None
    return len(rewards) > 1 or (baseline is not None and any(v != baseline for v in rewards))


def staleness(trainer_version: int, version: int) -> int:
    """How many weight versions `version` (a group's admission or a completion's) lags the
    trainer's current one."""
    return trainer_version - version


def too_stale(trainer_version: int, version: int, max_staleness: int) -> bool:
    """The one staleness check (engine/sync.py `WeightSync.fresh`, pipeline/continuous.py):
    True when a group of `version` would be trained more than `max_staleness` versions late."""
    return staleness(trainer_version, version) > max_staleness
