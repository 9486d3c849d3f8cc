"""One rollout step of the embedded runtime: sample groups, verify, keep the informative ones.

Invariant: each sampled completion becomes exactly one Rollout; a verifier
that raises marks its rollout with a typed error and masks it from the loss
(it is never scored 0); a group is trainable only when its scored rewards
are not all equal.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from posttrain.domains.registry import get
from posttrain.engine.base import Engine
from posttrain.errors import classify
from posttrain.types import Completion, Episode, GenerationRequest, SamplingParams, Score, Task


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
    """What execution produced for the verifier (a sandbox result, an environment's outcome)."""

    @property
    def reward(self) -> float | None:
        return None if self.score is None else self.score.value


def score_one(task: Task, completion: Completion) -> tuple[Score | None, str | None, str | None]:
    """The verifier's score, or (None, kind, message) when it raised."""
    try:
        return (
            get(task.domain).score(task, Episode(completion.text, finish_reason=completion.finish_reason)),
            None,
            None,
        )
    except Exception as exc:  # any escape from a verifier is an infra error, never reward 0
        return None, "verifier" if classify(exc) == "infra" else classify(exc), f"{type(exc).__name__}: {exc}"


def sample_groups(engine: Engine, tasks: Sequence[Task], params: SamplingParams, step: int) -> list[list[Rollout]]:
    """G completions per task, verified; one list per task."""
    t0 = time.perf_counter()
    reqs = [GenerationRequest(engine.encode_chat(t.prompt), params, f"{step}:{i}") for i, t in enumerate(tasks)]
    outputs = engine.generate(reqs)
    gen_s = (time.perf_counter() - t0) / max(1, sum(map(len, outputs)))
    groups = []
    for i, (task, group) in enumerate(zip(tasks, outputs)):
        rollouts = []
        for completion in group:
            t1 = time.perf_counter()
            score, kind, message = score_one(task, completion)
            timings = {"generate_s": gen_s, "verify_s": time.perf_counter() - t1}
            rollouts.append(Rollout(task, completion, f"{step}:{i}", score, kind, message, timings))
        groups.append(rollouts)
    return groups


def informative(group: Sequence[Rollout]) -> bool:
    """A group carries signal when its scored rewards are not all equal."""
    rewards = {r.reward for r in group if r.reward is not None}
    return len(rewards) > 1
