"""Typed trainer configuration: the loss is a discriminated union on `type`.

Invariant: a TrainerConfig that validates is runnable as is: every bound the
trainer relies on (positive learning rate, clip ranges, window sizes) is
checked here, unknown keys are rejected, and the model is frozen.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from posttrain.errors import ConfigError

_STRICT = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class GRPOLossConfig(BaseModel):
    """GRPO: group-normalised advantages, token mean per sequence, mean over sequences."""

    model_config = _STRICT
    type: Literal["grpo"] = "grpo"
    """Selects the GRPO loss."""
    clip_low: float = Field(0.2, gt=0.0, lt=1.0)
    """PPO clip below: the ratio is clipped at 1 - clip_low."""
    clip_high: float = Field(0.2, gt=0.0)
    """PPO clip above: the ratio is clipped at 1 + clip_high."""
    eps: float = Field(1e-6, gt=0.0)
    """Added to the group's reward standard deviation before dividing."""


class DrGRPOLossConfig(BaseModel):
    """Dr.GRPO: advantages r - group mean (no std), token sum over a constant."""

    model_config = _STRICT
    type: Literal["dr_grpo"] = "dr_grpo"
    """Selects the Dr.GRPO loss."""
    clip_low: float = Field(0.2, gt=0.0, lt=1.0)
    """PPO clip below: the ratio is clipped at 1 - clip_low."""
    clip_high: float = Field(0.2, gt=0.0)
    """PPO clip above: the ratio is clipped at 1 + clip_high."""
    max_completion_tokens: int = Field(ge=1)
    """The constant each sequence's token sum is divided by: set it to the
    sampling budget (max_tokens) so that the normaliser does not depend on length."""


class DAPOLossConfig(BaseModel):
    """DAPO: group-normalised advantages, clip-higher, mean over all tokens of the batch."""

    model_config = _STRICT
    type: Literal["dapo"] = "dapo"
    """Selects the DAPO loss."""
    clip_low: float = Field(0.2, gt=0.0, lt=1.0)
    """PPO clip below: the ratio is clipped at 1 - clip_low."""
    clip_high: float = Field(0.28, gt=0.0)
    """PPO clip above (clip-higher): the ratio is clipped at 1 + clip_high."""
    eps: float = Field(1e-6, gt=0.0)
    """Added to the group's reward standard deviation before dividing."""


class RLOOLossConfig(BaseModel):
    """RLOO: leave-one-out baseline r_i - mean_{j != i} r_j, token sum per sequence, mean over sequences."""

    model_config = _STRICT
    type: Literal["rloo"] = "rloo"
    """Selects the RLOO loss."""
    clip_low: float = Field(0.2, gt=0.0, lt=1.0)
    """PPO clip below: the ratio is clipped at 1 - clip_low (on-policy the ratio is 1 and the
    loss is plain REINFORCE)."""
    clip_high: float = Field(0.2, gt=0.0)
    """PPO clip above: the ratio is clipped at 1 + clip_high."""


class ReinforcePPLossConfig(BaseModel):
    """REINFORCE++-baseline: r - group mean, divided by the batch's std; mean over all tokens."""

    model_config = _STRICT
    type: Literal["reinforce_pp"] = "reinforce_pp"
    """Selects the REINFORCE++-baseline loss."""
    clip_low: float = Field(0.2, gt=0.0, lt=1.0)
    """PPO clip below: the ratio is clipped at 1 - clip_low."""
    clip_high: float = Field(0.2, gt=0.0)
    """PPO clip above: the ratio is clipped at 1 + clip_high."""
    eps: float = Field(1e-6, gt=0.0)
    """Added to the batch's standard deviation of the group-centred rewards before dividing."""


class GSPOLossConfig(BaseModel):
    """GSPO: one importance ratio per sequence (the geometric mean of its token ratios), clipped
    per sequence; group-normalised advantages; mean over sequences."""

    model_config = _STRICT
    type: Literal["gspo"] = "gspo"
    """Selects the GSPO loss."""
    clip_low: float = Field(3e-4, gt=0.0, lt=1.0)
    """Sequence clip below: the sequence ratio is clipped at 1 - clip_low (the paper's 3e-4)."""
    clip_high: float = Field(4e-4, gt=0.0)
    """Sequence clip above: the sequence ratio is clipped at 1 + clip_high (the paper's 4e-4)."""
    eps: float = Field(1e-6, gt=0.0)
    """Added to the group's reward standard deviation before dividing."""


class CISPOLossConfig(BaseModel):
    """CISPO (MiniMax-M1): each token's log-prob weighted by its detached, clipped importance
    ratio times the advantage; no token loses its gradient; mean over all tokens."""

    model_config = _STRICT
    type: Literal["cispo"] = "cispo"
    """Selects the CISPO loss."""
    clip_low: float = Field(1.0, gt=0.0, le=1.0)
    """The IS weight is clipped below at 1 - clip_low; 1.0 (the default) is no lower bound, as
    MiniMax-M1 ran it."""
    clip_high: float = Field(0.28, gt=0.0)
    """The IS weight is clipped above at 1 + clip_high (0.28: Trinity-RFT's default; MiniMax-M1
    tunes only this bound)."""
    eps: float = Field(1e-6, gt=0.0)
    """Added to the group's reward standard deviation before dividing."""


LossConfig = Annotated[
    GRPOLossConfig
    | DrGRPOLossConfig
    | DAPOLossConfig
    | RLOOLossConfig
    | ReinforcePPLossConfig
    | GSPOLossConfig
    | CISPOLossConfig,
    Field(discriminator="type"),
]


class LoraConfig(BaseModel):
    """LoRA through peft: only the adapters train; checkpoints and weight updates carry only them."""

    model_config = _STRICT
    rank: int = Field(8, ge=1, le=4096)
    """Rank r of each adapter (A is r x in, B is out x r)."""
    alpha: float = Field(16.0, gt=0.0)
    """Scaling numerator: the update is (alpha / rank) x B A."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter input (0 keeps on-policy ratios exactly 1)."""
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """Names of the linear layers that get an adapter (Qwen2/Llama naming)."""

    @field_validator("target_modules")
    @classmethod
    def _some_targets(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        if not names or any(not n for n in names):
            raise ValueError("target_modules must name at least one module, none empty")
        return names


class GuardConfig(BaseModel):
    """The loss-spike guard: what counts as a bad step and what to do about it."""

    model_config = _STRICT
    spike_factor: float = Field(10.0, gt=1.0)
    """A step spikes when its grad norm, or its |loss|, exceeds this factor
    times the running median of accepted steps."""
    window: int = Field(50, ge=1, le=10_000)
    """How many accepted steps the running medians cover."""
    min_history: int = Field(5, ge=1)
    """Spike checks start once this many steps were accepted (non-finite
    values are caught from the first step)."""
    loss_floor: float = Field(1.0, ge=0.0)
    """|loss| is compared with spike_factor x max(median |loss|, loss_floor),
    since policy-gradient losses hover around zero."""
    action: Literal["skip", "rollback"] = "skip"
    """skip: drop the step (optimizer not stepped, grads zeroed). rollback:
    also restore parameters and optimizer state to the last step whose loss
    passed the guard (an in-memory copy, taken before its update)."""


class MismatchConfig(BaseModel):
    """The train-inference mismatch: the gap between the engine's behaviour log-probs and the
    trainer's own log-probs of the same tokens before the update (always measured, in the
    metrics' train rows), and an optional correction of the loss for it."""

    model_config = _STRICT
    correction: Literal["none", "tis", "mask"] = "none"
    """none (the default): the loss's PPO ratio is taken against the behaviour log-probs, as
    before. tis (truncated importance sampling): the ratio is taken against the trainer's own
    log-probs before the update, and each token's loss is weighted by
    min(exp(logp_trainer - logp_behaviour), bound). mask: the same ratio, and tokens whose
    exp(logp_trainer - logp_behaviour) lies outside [1/bound, bound] get weight 0 (the rest 1).
    Off by default: on the in-process hf engine the gap is float rounding (~1e-6), so a
    correction changes nothing there but the ratio the clip sees."""
    bound: float = Field(2.0, gt=1.0, le=1e6)
    """C: the truncation of tis, the two-sided bound of mask, and the ratio bound that the
    `mismatch_outside` metric counts tokens beyond (ratio > C or < 1/C)."""
    alarm_abs_mean: float | None = Field(0.3, gt=0.0, le=100.0)
    """A logged alarm when a step's batch has a mean |trainer log-prob - behaviour log-prob|
    (`mismatch_abs_mean`, before the update) above this (engine/guard.py); None: no alarm. Honest
    engines measured below it: the in-process hf engine at most 3.2e-7 on-policy (float rounding)
    and 0.087 under pipeline.max_staleness 1, where the gap also holds one optimizer step of
    policy change (the demo's learning rate); the vllm engine (CPU, float32) 0.047 under
    max_staleness 1 (docs/reliability.md)."""
    stop_abs_mean: float | None = Field(1.0, gt=0.0, le=100.0)
    """The run stops (EngineFault, naming this figure and the sync probe's) when a step's batch has a
    mean |trainer log-prob - behaviour log-prob| above this, before the step's weights are pushed
    or saved: the engine's rollouts do not come from the trainer's weights (a server answering the
    probe from the pushed weights and every rollout from the initial ones measured 2.6 to 6.2).
    None: never."""


class EntropyBonusConfig(BaseModel):
    """An entropy bonus in the loss: the trainer subtracts coef x the policy's token entropy (at the
    sampling temperature, over the vocabulary, at each loss token) from every loss, as a token mean
    over the step's loss tokens. A domain's coefficient is the larger of this configured one and
    the one the monitor raised it to (`monitor.countermeasures`)."""

    model_config = _STRICT
    coef: float = Field(0.0, ge=0.0, le=1.0)
    """Coefficient for every domain not named in `domains` (0: no bonus)."""
    domains: dict[str, float] = Field(default_factory=dict)
    """Per-domain coefficient, overriding `coef` for the domains named (each in [0, 1])."""

    @field_validator("domains")
    @classmethod
    def _bounded(cls, coefs: dict[str, float]) -> dict[str, float]:
        for name, value in coefs.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"entropy_bonus.domains.{name} must be in [0, 1], got {value}")
        return coefs


class ReplayConfig(BaseModel):
    """The replay buffer (trainer.replay; the loop keeps it, trainer/replay.py): groups trained on
    at one step are kept, bounded, and trained on again at later steps, with the behaviour
    log-probs they were sampled with. The ratio each replayed token's PPO clip sees is the one
    every row gets (trainer.mismatch.correction none: current policy over the behaviour log-prob
    it was sampled with, so an old row's ratio is clipped like a stale async row's; tis or mask:
    over the trainer's own log-prob before the update, with the truncated or masked
    exp(trainer - behaviour) as its weight). A replayed group is no new draw: its draw keeps the
    one fate it had; its replays are `replay` trace events (docs/trainer.md)."""

    model_config = _STRICT
    enabled: bool = False
    """Keep and replay groups (off by default: the demo trains only on what each step samples)."""
    capacity: int = Field(32, ge=1, le=100_000)
    """Most groups the buffer holds; admitting one more evicts the oldest (by the step that
    sampled it)."""
    admit: Literal["rare", "mixed"] = "rare"
    """Which trained groups enter: rare (the default), groups with mixed rewards in which at most
    `rare_share` of the scored samples passed (the rare successes of hard tasks); mixed: every
    trained group whose scored rewards are not all equal. A group with equal rewards carries no
    signal and never enters."""
    rare_share: float = Field(0.25, gt=0.0, le=1.0)
    """admit rare: the largest share of a group's scored samples that may have passed."""
    domains: tuple[str, ...] = ()
    """Only groups of these domains enter (empty, the default: every domain)."""
    share: float = Field(0.125, gt=0.0, le=1.0)
    """Groups replayed per step, as a share of rollout.prompts_per_step: round(share x
    prompts_per_step) groups, at least 1, when the buffer holds that many (fewer otherwise)."""
    max_age: int = Field(8, ge=1, le=100_000)
    """The largest gap, in weight versions, between the weights that generated a group (the
    oldest among its scored completions) and the weights a replay trains it at: a group made by
    version v is replayed only while the trainer is at v + 1 .. v + max_age (in sync mode, where
    every step that updates pushes one version, the steps after the one that sampled it; in
    async mode a group first trained k versions late has max_age - k left). Older entries are
    evicted before each step takes its replays."""
    max_replays: int = Field(2, ge=1, le=1000)
    """Times one group is replayed before it leaves the buffer. A step takes the entries
    replayed least often first, the most recently sampled among equals."""


class DraftHeadConfig(BaseModel):
    """A draft head co-trained with the policy (model/draft_head.py): fitted each step on the
    step's own rollouts from the policy's detached hidden states, with its own optimizer, so the
    policy's update is the same with it on or off; saved in checkpoints and exports, and the
    hf engine's drafter with `engine.speculation.kind: head`."""

    model_config = _STRICT
    enabled: bool = False
    """Train a draft head beside the policy (off by default)."""
    depth: int = Field(4, ge=1, le=16)
    """Tokens the head drafts ahead (each depth trained on the tokens that many positions on)."""
    lr: float = Field(1e-3, gt=0.0, le=1.0)
    """The head's AdamW learning rate (its own optimizer; the policy's is untouched)."""
    grad_clip: float = Field(1.0, gt=0.0)
    """Clip the head's gradient norm to this value."""
    passes: int = Field(1, ge=1, le=64)
    """Times the head is fitted on each step's tokens: the first pass joins the policy's backward
    (one head step after the micro-batches), each further one is a head-only pass over every
    micro-batch's saved hidden states (detached, a few MB) with a head step each. More passes
    train the head faster from the same rollouts; the policy's update is the same."""
    vocab: int = Field(4096, ge=0)
    """Draft over this many most frequent tokens of the rollouts the head was fitted on
    (frequency-ranked, as FR-Spec): a draft step then reads that many rows of the LM head, not
    all of them, and the head is fitted over the same rows (a target outside them is never
    drafted); 0: the whole vocabulary. Speed only: drafts are verified either way."""


class TrainerConfig(BaseModel):
    """Everything the RL trainer needs besides the model."""

    model_config = _STRICT
    loss: LossConfig = Field(default_factory=GRPOLossConfig)
    """The policy loss, chosen by `type`: grpo, dr_grpo, dapo, rloo, reinforce_pp, gspo or cispo."""
    lr: float = Field(3e-4, gt=0.0, le=1.0)
    """AdamW learning rate (3e-4 suits the embedded ~1M model; larger models want ~1e-6)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas, each in [0, 1)."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW decoupled weight decay."""
    grad_clip: float = Field(1.0, gt=0.0)
    """Clip the total gradient norm to this value."""
    kl_coef: float = Field(0.0, ge=0.0)
    """Weight of the k3 KL estimate to a reference model; 0 means no reference
    model is loaded."""
    micro_batch_size: int | Literal["auto"] = "auto"
    """Rows per forward/backward; gradients accumulate over the step's batch. "auto" (the
    default): no row cap; the step's rows, sorted by length, are cut where a new
    forward/backward costs less than the padding it saves, within a padded-token budget
    sized from available memory (free CUDA memory on a GPU, MemAvailable on the CPU),
    unless micro_batch_tokens sets that budget. An integer caps the rows per micro-batch."""
    normalise: Literal["sampled", "kept"] = "sampled"
    """What the loss's normalisers count. "sampled" (the default): every scored row (and its
    loss tokens) the step sampled, including groups dropped because their rewards are all
    equal (their gradient is exactly zero, so dropping them only saves compute); the
    gradient then scales with the share of informative groups. "kept": only the rows that
    enter the loss (the behaviour before 2026-11-30; every step has the same scale)."""
    coast: bool = True
    """A step in which no sampled group carries signal has a policy gradient of exactly zero
    (filtered groups enter no loss, so with kl_coef > 0 their KL term is left out too); true
    (the default): the optimizer still takes that step, as any torch training loop (and TRL)
    does, so Adam's moments carry the last updates on and weight decay applies (outcome
    "coasted"). False: nothing changes (outcome "no_signal"; the behaviour before 2026-12-01)."""
    sort_by_length: bool = True
    """Order the step's rows by length before cutting micro-batches, so that
    each pads to a similar length; the loss is the same up to float summation order."""
    guard: GuardConfig = Field(default_factory=GuardConfig)
    """The loss-spike guard."""
    mismatch: MismatchConfig = Field(default_factory=MismatchConfig)
    """The train-inference mismatch: its bound and an optional correction (off by default)."""
    entropy_bonus: EntropyBonusConfig = Field(default_factory=EntropyBonusConfig)
    """Entropy bonus in the loss, global and per domain (off by default). A domain with a
    coefficient above 0 keeps its groups without reward variance in the step (dynamic sampling
    does not drop them): they enter the entropy term only, their advantage being 0."""
    seed: int = Field(0, ge=0)
    """Seeds python, numpy and torch when a Trainer is constructed."""
    keep_checkpoints: int = Field(3, ge=1)
    """How many of the newest checkpoints to keep in a run directory."""
    lora: LoraConfig | None = None
    """Train LoRA adapters instead of every weight (None: full fine-tuning)."""
    precision: Literal["float32", "bf16_autocast"] = "float32"
    """bf16_autocast runs forward/backward under torch.autocast(bfloat16) with
    float32 master weights and a float32 log-softmax (CUDA, and CPU for tests)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward (less memory, ~30% more compute);
    `posttrain sft` reads it too."""
    micro_batch_tokens: int | Literal["auto"] | None = None
    """Cap on padded tokens (rows x longest row) per micro-batch, on top of
    micro_batch_size; "auto" sizes it from free CUDA memory (the whole batch on CPU)."""
    packing_tokens: int | None = Field(None, ge=1)
    """Sequence packing without padding: the step's rows are packed, first fit by decreasing
    length, into sequences of at most this many tokens (a longer row is a sequence of its own),
    each one forward/backward, with position ids restarting per row and attention kept within
    each row (transformers' packed-sequence mask); micro_batch_size, micro_batch_tokens and the
    forward of each shared prompt once do not apply. Same loss and gradients up to float
    rounding; the model must pass a packing probe at construction (ConfigError otherwise).
    None (the default): right-padded micro-batches."""
    logits_chunk_mib: float | None = Field(64.0, gt=0.0)
    """The LM head runs on the loss positions a chunk at a time, each chunk's float32 logits
    taking at most this many MiB (max(1, MiB x 2^20 / (4 x vocab)) positions: 341 for a
    49,152-token vocabulary); log-probs and entropies are reduced per chunk and its backward
    recomputes that chunk alone, so no positions x vocabulary tensor is held (same values up to
    float rounding; trainer/chunked.py). None: every loss position of a micro-batch at once.
    Applies when the head splits from the model (not under fsdp); `posttrain sft` reads it too,
    its assistant-token positions through the head the same way."""
    deterministic: bool = False
    """Pin RNG and kernels: torch.use_deterministic_algorithms, no cuDNN benchmark,
    a fixed cuBLAS workspace; the same seed then gives the same step on CUDA."""
    fsdp: bool = False
    """Shard parameters, gradients and optimizer state with FSDP2 (fully_shard) across
    the torch.distributed process group (torchrun); rows are split across ranks."""
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    """The replay buffer of past groups (off by default; ReplayConfig)."""
    draft_head: DraftHeadConfig = Field(default_factory=DraftHeadConfig)
    """The co-trained draft head for speculative decoding (off by default; DraftHeadConfig)."""

    @field_validator("micro_batch_size")
    @classmethod
    def _row_cap(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"micro_batch_size must be >= 1 or 'auto', got {value}")
        return value

    @field_validator("micro_batch_tokens")
    @classmethod
    def _token_budget(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"micro_batch_tokens must be >= 1, 'auto' or null, got {value}")
        return value

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, betas: tuple[float, float]) -> tuple[float, float]:
        for i, beta in enumerate(betas):
            if not 0.0 <= beta < 1.0:
                raise ValueError(f"betas[{i}] must be in [0, 1), got {beta}")
        return betas


def load_trainer_config(data: Mapping[str, Any]) -> TrainerConfig:
    """A TrainerConfig from plain data; a bad field raises ConfigError naming it."""
    try:
        return TrainerConfig.model_validate(dict(data))
    except ValidationError as exc:
        lines = [f"trainer.{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in exc.errors()]
        raise ConfigError("invalid trainer config: " + "; ".join(lines)) from None
