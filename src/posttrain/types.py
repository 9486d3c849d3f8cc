"""Typed frozen records that cross stage boundaries.

Invariant: every record here is immutable and JSON-serialisable through
`to_dict`; no stage passes dicts of string keys to another.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Split = Literal["train", "eval"]
CostClass = Literal["short", "long"]
FinishReason = Literal["stop", "length", "error"]


@dataclass(frozen=True)
class Message:
    role: Literal["system", "user", "assistant", "tool"]
    content: str


@dataclass(frozen=True)
class TaskMeta:
    split: Split
    difficulty: int
    source: str
    taskset_version: str
    reward_weights: tuple[tuple[str, float], ...] = ()
    """(part, weight) pairs from `tasks.domains.<name>.reward_weights`, stamped by the
    task pool: `Domain.score` makes the reward their weighted mean. Empty: the
    verifier's own value."""
    priority: int | None = None
    """This task's admission priority (None: its domain's, `tasks.domains.<name>.priority`)."""


@dataclass(frozen=True)
class Task:
    """One task. `reference` is hidden from the model; verifiers read it."""

    id: str
    domain: str
    prompt: tuple[Message, ...]
    reference: Any
    meta: TaskMeta


@dataclass(frozen=True)
class StepResult:
    """What one `Environment.step` (envs/base.py) returns: the observation, whether the episode is over,
    the turn's reward parts and the turn's sandbox result (traced)."""

    observation: str
    done: bool = False
    parts: Mapping[str, float] = field(default_factory=dict)
    exec_result: Any = None


@dataclass(frozen=True)
class Turn:
    """One exchange of a multi-turn episode: the model's action, what came back,
    the sandbox result of the turn (traced) and the turn's reward parts."""

    action: str
    observation: str = ""
    exec_result: Any = None
    parts: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Episode:
    """What a verifier scores: the final completion text and, for multi-turn
    domains, every turn. `exec_result` holds a sandbox result when one ran."""

    completion: str
    turns: tuple[Turn, ...] = ()
    finish_reason: FinishReason = "stop"
    exec_result: Any = None


@dataclass(frozen=True)
class Score:
    """value in [0, 1]; named parts (outcome, protocol, efficiency, ...)."""

    value: float
    parts: Mapping[str, float] = field(default_factory=dict)
    passed: bool = False
    reason: str = ""

    def __post_init__(self) -> None:
        if not (0.0 <= self.value <= 1.0):
            raise ValueError(f"Score.value must be in [0, 1], got {self.value!r}")


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    seed: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt (already rendered to token ids) to sample `params.n` times."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams
    request_id: str = ""
    sessions: tuple[str, ...] = ()
    """Empty, or one key per sample: the episode each sample continues. An engine that keeps
    contexts (hf with context_reuse) keeps each sample's after the call under its key, and a
    later one-sample request of that key whose prompt starts with the kept tokens computes
    only the rest; `Engine.end_sessions` drops them. Other engines ignore it."""


@dataclass(frozen=True)
class Completion:
    """One sampled continuation. `logprobs` are the behaviour policy's
    log-probabilities of `token_ids`, one per token."""

    prompt_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    model_version: int = 0
    cached_tokens: int = 0
    """Prompt tokens the engine did not compute for this completion (the hf engine: a kept
    session's context, or a group-mate's shared prompt); 0 where the engine does not say."""
    fault: str = ""
    """Why the engine's answer for this sample was refused (engine/validate.py: impossible ids,
    log-probs, lengths or version); the completion is then empty and the pipeline masks the
    sample with kind "engine". Empty: a sample of the model."""


def to_dict(record: Any) -> Any:
    """Plain-JSON view of a record (for traces and metrics)."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: to_dict(getattr(record, f.name)) for f in dataclasses.fields(record)}
    if isinstance(record, Mapping):
        return {str(k): to_dict(v) for k, v in record.items()}
    if isinstance(record, (list, tuple)):
        return [to_dict(v) for v in record]
    return record
