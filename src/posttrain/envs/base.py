"""The Environment contract for multi-turn episodes, and the token ledger of one trajectory.

Invariant: a trajectory's completion holds, in order, every token the model
sampled (loss mask 1, its behaviour log-prob) and every token the
environment contributed (observations and the chat template around them:
loss mask 0, log-prob 0.0), so the context the model saw at each turn is
exactly the prompt plus the completion so far, and the loss covers only the
model's own tokens.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from posttrain.types import Completion, FinishReason, Message, Task, Turn


@dataclass(frozen=True)
class StepResult:
    observation: str
    done: bool = False
    parts: Mapping[str, float] = field(default_factory=dict)
    exec_result: Any = None


class Environment(Protocol):
    """A multi-turn world. `reset` starts an episode for a task and returns a
    first observation ("" for none); `step` takes the model's action and
    returns (observation, done). A malformed action is an observation, not an
    exception; exceptions mean the environment itself failed (infra).
    Optional: `outcome()` (what the verifier sees as Episode.exec_result) and
    `turn_cost` (reward subtracted per turn after the first)."""

    def reset(self, task: Task) -> str: ...

    def step(self, action: str) -> tuple[str, bool]: ...


def make_environment(domain: Any) -> Environment | None:
    """A fresh environment of `domain` (its `environment()` returns a factory
    or an instance), or None for single-turn domains."""
    made = domain.environment()
    if made is None:
        return None
    env: Environment = made() if isinstance(made, type) or not hasattr(made, "reset") else made
    if not (hasattr(env, "reset") and hasattr(env, "step")):
        raise TypeError(f"domain {domain.name}: environment() gave {type(env).__name__}, which has no reset/step")
    return env


@dataclass
class Trajectory:
    """One multi-turn episode in progress (owned by one pipeline item)."""

    env: Environment
    messages: list[Message]
    prompt_ids: tuple[int, ...]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    done: bool = False
    awaiting_step: bool = False
    """The last action has not been given to the environment yet."""
    finish_reason: FinishReason = "stop"

    def context(self) -> tuple[int, ...]:
        """What the model conditions on for its next turn."""
        return self.prompt_ids + tuple(self.ids)

    def add_action(self, completion: Completion) -> None:
        self.ids += completion.token_ids
        self.logprobs += completion.logprobs
        self.mask += [1] * len(completion.token_ids)
        self.versions.append(completion.model_version)
        self.messages.append(Message("assistant", completion.text))
        self.turns.append(Turn(completion.text))
        self.finish_reason = completion.finish_reason
        self.awaiting_step = True

    def add_observation(self, observation: str, rendered_before: Sequence[int], rendered_after: Sequence[int],
                        standalone: Sequence[int]) -> None:
        """Append the observation's tokens (mask 0). `rendered_before` is the chat
        rendering up to the last action's turn opener, `rendered_after` the one
        including the action and the observation; when the tokenizer is prefix
        stable the bridge is what follows the action in `rendered_after`, else
        the observation's `standalone` rendering."""
        self.turns[-1] = Turn(self.turns[-1].action, observation)
        self.messages.append(Message("tool", observation))
        head = tuple(rendered_before) + tuple(self.ids[len(self.ids) - self._last_action_len():])
        bridge = tuple(rendered_after[len(head):]) if tuple(rendered_after[: len(head)]) == head else tuple(standalone)
        self.ids += bridge
        self.logprobs += [0.0] * len(bridge)
        self.mask += [0] * len(bridge)

    def _last_action_len(self) -> int:
        n = 0
        for m in reversed(self.mask):
            if m != 1:
                break
            n += 1
        return n

    def completion(self) -> Completion:
        return Completion(
            prompt_ids=self.prompt_ids, token_ids=tuple(self.ids),
            text=self.turns[-1].action if self.turns else "", logprobs=tuple(self.logprobs),
            finish_reason=self.finish_reason, model_version=min(self.versions, default=0),
        )
