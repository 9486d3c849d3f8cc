"""Multi-turn episodes on the Environment contract (contracts/environment.py): making one
for a domain (`make_environment`, checked against the contract), and the token ledger of
one trajectory.

Invariant: a trajectory's completion holds, in order, every token the model
sampled (loss mask 1, its behaviour log-prob) and every token the
environment contributed (observations and the chat template around them:
loss mask 0, log-prob 0.0), so the context the model saw at each turn is
exactly the prompt plus the completion so far, and the loss covers only the
model's own tokens. An observation's images (`StepResult.images`) ride on its tool message, so
every later turn's request carries every image of its context in order (`images`: the task
prompt's, then each observation's), and the completion names the pixels its last turn's
generator saw (`Completion.pixel_digest`): those of every image the completion's tokens hold.
An observation whose images no generation saw (the episode ended before another turn) is
left out of the completion, so a row never holds an image the generator did not see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from posttrain.contracts.environment import Environment
from posttrain.types import Completion, FinishReason, Image, Message, StepResult, Turn, add_spec

__all__ = ["Environment", "StepResult", "as_step_result", "make_environment"]


def make_environment(domain: Any) -> Environment | None:
    """A fresh environment of `domain` (its `environment()` returns a factory: a class or a
    zero-arg callable, or an Environment itself), or None for single-turn domains. TypeError,
    naming what is missing, when what it makes is not an Environment."""
    made = domain.environment()
    if made is None:
        return None
    env = made if isinstance(made, Environment) and not isinstance(made, type) else made()
    if not isinstance(env, Environment):
        missing = [m for m in _MEMBERS if not callable(getattr(env, m, None))]
        raise TypeError(
            f"domain {domain.name}: environment() gave {type(env).__name__}, which has no "
            f"{'/'.join(missing)} (the Environment contract: reset, step, close)"
        )
    return env


_MEMBERS = ("reset", "step", "close")
"""The Environment contract's members (named in make_environment's error)."""


def as_step_result(got: Any) -> StepResult:
    """`step`'s answer as a StepResult (an `(observation, done)` pair is accepted too)."""
    if isinstance(got, StepResult):
        return got
    if isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], str):
        return StepResult(got[0], bool(got[1]))
    raise TypeError(f"Environment.step must return a StepResult, got {type(got).__name__}")


@dataclass
class Trajectory:
    """One multi-turn episode in progress (owned by one pipeline item or one `play` call). It
    ends on done, at the turn budget, at a truncated action, or past its time budget
    (`max_seconds`, its own seconds: `own_s`)."""

    env: Environment
    messages: list[Message]
    prompt_ids: tuple[int, ...]
    max_turns: int = 1
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    done: bool = False
    awaiting_step: bool = False
    """The last action has not been given to the environment yet."""
    finish_reason: FinishReason = "stop"
    error: str | None = None
    """The infra error kind that masked this episode (None: it ran to its end)."""
    error_message: str = ""
    """What failed when it was masked ("": not said): the rollout's error names it."""
    fault: str | None = None
    """The model fault that ended this episode (its action made the environment raise):
    scored 0 with this reason, never masked (None: none)."""
    first_observation: str = ""
    """What `reset` returned (in the prompt, after the task's messages)."""
    max_seconds: float | None = None
    train_from: int = 1
    """This episode's first turn whose action carries the loss (`loss_mask` 1); earlier actions
    are context there, mask 0 (`Budget.train_from`, less a derived task's prompt turns). `mask`
    itself marks every action (the observation bridge reads it)."""
    """The episode's time budget (`Budget.seconds`; None: none): once `own_s` reaches it after
    a step, the episode ends as truncated (`timed_out`), and is scored."""
    own_s: float = 0.0
    """Seconds the episode itself took: its environment steps, and its group's share of the
    engine calls that generated its turns (not queueing, not retries' backoff)."""
    timed_out: bool = False
    """The episode ended at its time budget (finish reason "length")."""
    prompt_computed: int = 0
    """Prompt tokens the engine computed for this episode over its turns: each turn's context
    less what the engine took from a cache (`Completion.cached_tokens`: a kept session's
    context, a group-mate's shared prompt)."""
    prompt_new: int = 0
    """Prompt tokens new to the episode over its turns: the first turn's whole prompt, then on
    each later turn what follows the previous turn's prompt and action (the observation)."""
    spec: tuple[int, ...] = ()
    """Speculation over the episode's turns (`Completion.spec` summed): drafts verified, draft
    tokens proposed, draft tokens accepted; empty while nothing was drafted."""
    _seen: int = field(default=0, repr=False)
    """Tokens of the last turn's prompt and action (what the next turn's prompt starts with)."""
    _seen_images: int = field(default=0, repr=False)
    """Images the last turn's request carried (the first this many of `images`)."""
    _action_end: int = field(default=0, repr=False)
    """len(ids) right after the last action: where the completion ends when a later observation
    holds images no generation saw."""
    _train_start: int = field(default=-1, repr=False)
    """Where turn `train_from`'s action begins in `ids` (-1: no action of that turn yet)."""
    _pixel_digest: str = field(default="", repr=False)
    """The last turn's `Completion.pixel_digest` (the pixels of its request's images)."""
    _obs_images: tuple[Image, ...] = field(default=(), repr=False)
    """The last step's observation images (`StepResult.images`), until the observation joins."""

    @property
    def images(self) -> tuple[Image, ...]:
        """Every image of the episode's context, in the order its image tokens run: the task
        prompt's, then each observation's that joined the context."""
        return tuple(i for m in self.messages for i in m.images)

    @property
    def seen_images(self) -> tuple[Image, ...]:
        """The images the completion's tokens hold (`images`, less an unseen last observation's)."""
        return self.images[: self._seen_images] if self._unseen() else self.images

    def _unseen(self) -> bool:
        return len(self.images) > self._seen_images and bool(self.turns)

    def _end(self) -> int:
        return self._action_end if self._unseen() else len(self.ids)

    @property
    def loss_mask(self) -> tuple[int, ...]:
        """The completion's loss mask (1: the model's tokens from turn `train_from` on; 0:
        observations, and the actions before that turn, kept as context)."""
        mask = self.mask[: self._end()]
        start = len(mask) if self._train_start < 0 else self._train_start
        return tuple(0 if i < start else m for i, m in enumerate(mask))

    def context(self) -> tuple[int, ...]:
        """What the model conditions on for its next turn."""
        return self.prompt_ids + tuple(self.ids)

    def add_action(self, completion: Completion) -> None:
        context = len(self.prompt_ids) + len(self.ids)
        self.prompt_computed += max(0, context - completion.cached_tokens)
        self.prompt_new += context - self._seen
        self._seen = context + len(completion.token_ids)
        self._seen_images, self._pixel_digest = len(self.images), completion.pixel_digest
        if len(self.turns) + 1 == self.train_from:
            self._train_start = len(self.ids)
        self.spec = add_spec(self.spec, completion.spec)
        self.ids += completion.token_ids
        self.logprobs += completion.logprobs
        self.mask += [1] * len(completion.token_ids)
        self._action_end = len(self.ids)
        self.versions.append(completion.model_version)
        self.messages.append(Message("assistant", completion.text))
        self.turns.append(Turn(completion.text))
        self.finish_reason = completion.finish_reason
        self.awaiting_step = True

    def record(self, result: StepResult) -> None:
        """The environment's answer to the last action: kept in its Turn (observation,
        parts, exec_result); the episode ends on done, at the turn budget, or when the
        action was truncated at its token budget."""
        self.turns[-1] = replace(
            self.turns[-1],
            observation=result.observation,
            parts=dict(result.parts),
            exec_result=result.exec_result,
            images=tuple(i.sha256 for i in result.images),
        )
        self._obs_images = result.images
        self.awaiting_step = False
        self.done = result.done or len(self.turns) >= self.max_turns or self.finish_reason == "length"
        if not self.done and self.max_seconds is not None and self.own_s >= self.max_seconds:
            self.done, self.timed_out, self.finish_reason = True, True, "length"

    def render_inputs(self) -> tuple[list[Message], list[Message], list[Message]]:
        """The three chat renderings `add_observation` needs (encode each with the
        model's chat template): up to the last action's turn opener, with the last
        observation appended, and the observation alone."""
        obs = Message("tool", self.turns[-1].observation, self._obs_images)
        return self.messages[:-1], [*self.messages, obs], [obs]

    def add_observation(
        self, rendered_before: Sequence[int], rendered_after: Sequence[int], standalone: Sequence[int]
    ) -> None:
        """Append the last turn's observation tokens (mask 0). `rendered_before` is the
        chat rendering up to the last action's turn opener, `rendered_after` the one
        including the action and the observation; when the tokenizer is prefix stable
        the bridge is what follows the action in `rendered_after`, else the
        observation's `standalone` rendering."""
        self.messages.append(Message("tool", self.turns[-1].observation, self._obs_images))
        self._obs_images = ()
        head = tuple(rendered_before) + tuple(self.ids[len(self.ids) - self._last_action_len() :])
        bridge = tuple(rendered_after[len(head) :]) if tuple(rendered_after[: len(head)]) == head else tuple(standalone)
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
        """The episode as one sampled sequence: every token up to the end (up to the last action
        when a later observation's images were never seen), with the last turn's pixel digest."""
        end = self._end()
        return Completion(
            prompt_ids=self.prompt_ids,
            token_ids=tuple(self.ids[:end]),
            text=self.turns[-1].action if self.turns else "",
            logprobs=tuple(self.logprobs[:end]),
            finish_reason=self.finish_reason,
            model_version=min(self.versions, default=0),
            pixel_digest=self._pixel_digest if self.seen_images else "",
            spec=self.spec,
        )
