"""The trainer's input records: one TrainRow per sampled completion.

Invariant: a TrainRow that constructs is trainable as is: its completion,
behaviour log-probs and loss mask have one entry per completion token, the
behaviour log-probs and the reward are finite, and the mask holds only 0 and 1.
Torch-free, so the loop can build batches without importing torch: `batch_of` makes a
step's batch from its kept groups of rollouts (`rows_of` a group's rows).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from posttrain.errors import TrainerError
from posttrain.rollout import Rollout
from posttrain.types import Completion, Image


@dataclass(frozen=True)
class TrainRow:
    """One sampled completion with its reward.

    `behaviour_logprobs` are the log-probs the sampling policy gave each
    completion token (log_softmax(logits / temperature)); `loss_mask` is 1
    for tokens the model produced and 0 for tokens it did not (tool output,
    observations in multi-turn episodes). `group_id` ties the samples of
    one prompt together; advantages are computed within a group.
    `temperature` 0 (greedy) is scored at temperature 1. `rollout_id` is the
    trace id of the rollout the row came from ("" for none): the trainer
    reports what it did with the row under that id (StepStats.rollouts).
    `entropy_coef` is the row's entropy-bonus coefficient (trainer.entropy_bonus): above 0,
    the row enters the loss's entropy term, even when its group carries no signal.
    A scored completion with no tokens is a row too: it counts in its
    group's advantages and enters no loss.
    `images` are the images the sequence holds (a vision task's prompt's, then a multi-turn
    episode's observation images, in the order of its image-token runs) and
    `pixel_digest` the digest of the pixels the generator fed the model for them
    (`Completion.pixel_digest`): a vision model's trainer recomputes the pixels from the images
    and refuses the row when they differ, or when image tokens and images disagree.
    `baseline` (None: none) is what the row's reward is judged against instead of its group's
    mean: the trainer takes its advantage as reward - baseline, whatever the loss
    (`TaskMeta.baseline`: a derived task's under `tasks.branch.baseline: fresh`).
    """

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    behaviour_logprobs: tuple[float, ...]
    reward: float
    group_id: Hashable
    loss_mask: tuple[int, ...]
    temperature: float = 1.0
    rollout_id: str = ""
    entropy_coef: float = 0.0
    images: tuple[Image, ...] = ()
    pixel_digest: str = ""
    baseline: float | None = None

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        if not self.prompt_ids:
            raise TrainerError("TrainRow.prompt_ids is empty: a completion needs a prompt token to condition on")
        for name in ("behaviour_logprobs", "loss_mask"):
            if len(getattr(self, name)) != n:
                raise TrainerError(f"TrainRow.{name} has {len(getattr(self, name))} entries but completion_ids has {n}")
        if not all(math.isfinite(x) for x in self.behaviour_logprobs):
            raise TrainerError("TrainRow.behaviour_logprobs holds a non-finite value")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise TrainerError("TrainRow.loss_mask must hold only 0 and 1")
        if not math.isfinite(self.reward):
            raise TrainerError(f"TrainRow.reward must be finite, got {self.reward!r}")
        if not (math.isfinite(self.entropy_coef) and self.entropy_coef >= 0.0):
            raise TrainerError(f"TrainRow.entropy_coef must be finite and >= 0, got {self.entropy_coef!r}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0.0):
            raise TrainerError(f"TrainRow.temperature must be finite and >= 0, got {self.temperature!r}")

    @property
    def n_loss_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def score_temperature(self) -> float:
        """The temperature log-probs are computed at (greedy counts as 1)."""
        return self.temperature if self.temperature > 0.0 else 1.0

    @classmethod
    def scoring(cls, prompt_ids: Sequence[int], token_ids: Sequence[int], temperature: float) -> TrainRow:
        """A row to score, not to train on: every token in the mask, behaviour log-probs and reward 0."""
        n = len(token_ids)
        return cls(tuple(prompt_ids), tuple(token_ids), (0.0,) * n, 0.0, "score", (1,) * n, float(temperature))

    @classmethod
    def from_completion(
        cls,
        completion: Completion,
        reward: float,
        group_id: Hashable,
        temperature: float,
        loss_mask: Sequence[int] | None = None,
        rollout_id: str = "",
        entropy_coef: float = 0.0,
        images: Sequence[Image] = (),
        baseline: float | None = None,
    ) -> TrainRow:
        """A row from an engine Completion (its pixel digest with it); the mask defaults to all ones."""
        mask = tuple(loss_mask) if loss_mask is not None else (1,) * len(completion.token_ids)
        ids, logprobs = (tuple(completion.prompt_ids), tuple(completion.token_ids)), tuple(completion.logprobs)
        return cls(
            *ids,
            logprobs,
            float(reward),
            group_id,
            mask,
            float(temperature),
            rollout_id,
            float(entropy_coef),
            tuple(images),
            completion.pixel_digest,
            None if baseline is None else float(baseline),
        )


@dataclass(frozen=True)
class RolloutLink:
    """What one train step did with one rollout (StepStats.rollouts, keyed by rollout id)."""

    advantage: float
    """The advantage the loss used (float32, as the loss saw it)."""
    ratio: float | None
    """Mean importance ratio over the rollout's loss tokens (GSPO: its sequence ratio, the
    geometric mean; None: it entered no loss on this rank)."""
    clipped: float | None
    """Share of its loss tokens whose gradient the PPO clip removed (GSPO: 1 or 0 for its
    sequence; CISPO: whose IS weight was truncated; None: as for `ratio`)."""


@dataclass(frozen=True)
class TrainBatch:
    """The rows of one optimizer step (all groups of the step, whole).

    `filtered_rows` and `filtered_tokens` count the scored rows (and their loss
    tokens) the caller sampled in this step but left out of `rows` because their
    groups carry no signal (all rewards equal: a gradient of exactly zero). With
    `trainer.normalise: sampled` they count in the loss's normalisers, so that
    filtering before the trainer gives the same gradient as passing them in.
    `rows` may be empty when `filtered_rows` is not: a step whose every group was
    filtered (with `trainer.coast` the trainer then takes a zero-gradient step).
    """

    rows: tuple[TrainRow, ...]
    filtered_rows: int = 0
    filtered_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.rows and self.filtered_rows <= 0:
            raise TrainerError("TrainBatch has no rows and no filtered rows: nothing was sampled")
        if self.filtered_rows < 0 or self.filtered_tokens < 0:
            raise TrainerError(
                "TrainBatch.filtered_rows and filtered_tokens must be >= 0, "
                f"got {self.filtered_rows} and {self.filtered_tokens}"
            )
        if not all(isinstance(r, TrainRow) for r in self.rows):
            raise TrainerError("TrainBatch.rows must hold TrainRow records")
        ids = [r.rollout_id for r in self.rows if r.rollout_id]
        if len(set(ids)) != len(ids):
            raise TrainerError("TrainBatch.rows hold a rollout_id twice: each row is one rollout")

    def __len__(self) -> int:
        return len(self.rows)


def rows_of(
    group: Sequence[Rollout], temperature: float, entropy_coef: Callable[[str], float] | None = None
) -> tuple[TrainRow, ...]:
    """The TrainRows of a group's scored rollouts, each carrying its trace id, its training reward
    (the verifier's plus any diversity bonus), its domain's entropy-bonus coefficient
    (`entropy_coef`; None: 0), the images its sequence holds (`Rollout.images`: the task
    prompt's, then a multi-turn episode's observation images) and its task's baseline
    (`TaskMeta.baseline`)."""
    coef = entropy_coef or (lambda _: 0.0)
    return tuple(
        TrainRow.from_completion(
            r.completion,
            r.train_reward,
            r.group_id,
            temperature,
            r.loss_mask,
            r.id,
            coef(r.task.domain),
            r.images,
            r.task.meta.baseline,
        )
        for r in group
        if r.train_reward is not None
    )


def batch_of(
    groups: Sequence[Sequence[Rollout]],
    temperature: float,
    filtered: Sequence[Sequence[Rollout]] = (),
    entropy_coef: Callable[[str], float] | None = None,
    replayed: Sequence[TrainRow] = (),
) -> TrainBatch | None:
    """One row per scored rollout of the kept `groups` (`rows_of`); a scored empty completion is
    a row too (it counts in its group's advantages, enters no loss), then the `replayed` rows
    (trainer.replay: past groups' TrainRows, as they were first trained). The scored rollouts of
    the `filtered` groups (sampled this step, left out) are counted, with their loss tokens, for
    the loss's normalisers (trainer.normalise). None when no rollout is scored (nothing was
    sampled to train on); a batch of no rows when every scored group was filtered (the trainer's
    zero-gradient step)."""
    rows = [row for g in groups for row in rows_of(g, temperature, entropy_coef)] + list(replayed)
    dropped = [r for g in filtered for r in g if r.reward is not None]
    tokens = sum(sum(r.loss_mask) if r.loss_mask is not None else len(r.completion.token_ids) for r in dropped)
    return TrainBatch(tuple(rows), filtered_rows=len(dropped), filtered_tokens=tokens) if rows or dropped else None
