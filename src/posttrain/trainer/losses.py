"""GRPO-family policy losses: small named classes chosen by the config's `type`
(grpo, dr_grpo, dapo, rloo, reinforce_pp, gspo, cispo).

Invariant: a loss is a sum over tokens of weight_bt x (policy term + kl_coef
x k3 KL), the policy term PPO-clip (GSPO: on the sequence ratio; CISPO: the
clipped, detached IS weight x A x logp), where the weights carry every normaliser and are computed from
whole-step totals (BatchTotals). Summing the losses of a step's micro-batches
therefore gives exactly the loss of the full batch, whatever the split.
Masked tokens (padding, tool output) have weight 0 and a log-ratio forced to
0, so no value they hold can turn the loss non-finite. Without a mismatch
correction the ratio is taken against the behaviour log-probs; with one
(`correct`: tis or mask) it is taken against the trainer's own log-probs
before the update, and each token's weight is multiplied by its correction
(a detached factor), so the sum stays exact across micro-batches.

A new loss: a config class with `type: Literal["NAME"]` in the `LossConfig` union
(configs/trainer.py), a class implementing `Loss` here (subclass `_PPOClip` for the
PPO-clip call), and one entry in `LOSSES`; never a chain of `if type == ...`. It may touch
the batch's tensors, its config and torch; never the loop, the pipeline or the engine. Test
it against a derivation and in `test_micro_batches_sum_to_the_full_batch`
(docs/extending.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from posttrain.configs.trainer import (
    CISPOLossConfig,
    DAPOLossConfig,
    DrGRPOLossConfig,
    GRPOLossConfig,
    GSPOLossConfig,
    LossConfig,
    ReinforcePPLossConfig,
    RLOOLossConfig,
)


@dataclass(frozen=True)
class BatchTotals:
    """Counts over every row of the step that contributes to the loss."""

    n_sequences: int
    n_tokens: int


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch, completion-aligned: position t is completion token t."""

    logp_bt: Tensor
    """Current policy log-probs (requires grad)."""
    behaviour_logp_bt: Tensor
    """Log-probs of the policy that sampled the tokens (the off-policy correction)."""
    mask_bt: Tensor
    """1.0 for tokens in the loss, 0.0 for padding and tool/observation tokens."""
    advantage_b: Tensor
    """One advantage per sequence."""
    ref_logp_bt: Tensor | None = None
    """Reference-model log-probs; needed when kl_coef > 0."""
    old_logp_bt: Tensor | None = None
    """With a mismatch correction: the trainer's own log-probs before the update (detached),
    which the PPO ratio is then taken against; None: against `behaviour_logp_bt`."""
    correction_bt: Tensor | None = None
    """With a mismatch correction: each token's weight factor (`correct`); None: 1."""


@dataclass(frozen=True)
class LossStats:
    """Token-level sums, so micro-batches merge exactly (`merge`)."""

    n_tokens: float = 0.0
    clipped_low: float = 0.0
    clipped_high: float = 0.0
    ratio_sum: float = 0.0
    ratio_max: float = 0.0
    kl_sum: float = 0.0

    def merge(self, other: LossStats) -> LossStats:
        return LossStats(
            n_tokens=self.n_tokens + other.n_tokens,
            clipped_low=self.clipped_low + other.clipped_low,
            clipped_high=self.clipped_high + other.clipped_high,
            ratio_sum=self.ratio_sum + other.ratio_sum,
            ratio_max=max(self.ratio_max, other.ratio_max),
            kl_sum=self.kl_sum + other.kl_sum,
        )

    def _per_token(self, total: float) -> float:
        return total / self.n_tokens if self.n_tokens else 0.0

    @property
    def clip_frac(self) -> float:
        """Share of loss tokens whose gradient the clip removed (either side; CISPO: whose IS
        weight the clip truncated, the gradient kept)."""
        return self._per_token(self.clipped_low + self.clipped_high)

    @property
    def ratio_mean(self) -> float:
        return self._per_token(self.ratio_sum)

    @property
    def kl_mean(self) -> float:
        return self._per_token(self.kl_sum)


# ---------------------------------------------------------------- advantages


def _group_sums(values_b: Tensor, group_b: Tensor, n_groups: int) -> Tensor:
    return torch.zeros(n_groups, dtype=values_b.dtype, device=values_b.device).index_add_(0, group_b, values_b)


def group_centred(reward_b: Tensor, group_b: Tensor) -> Tensor:
    """r - mean(r of its group), computed in float64; exactly 0 for every
    member of a group whose rewards are all equal."""
    reward_b = reward_b.to(torch.float64)
    n_groups = int(group_b.max().item()) + 1
    count_g = torch.bincount(group_b, minlength=n_groups).to(torch.float64)
    mean_g = _group_sums(reward_b, group_b, n_groups) / count_g.clamp(min=1.0)
    init = torch.full((n_groups,), float("inf"), dtype=torch.float64, device=reward_b.device)
    min_g = init.scatter_reduce(0, group_b, reward_b, reduce="amin")
    max_g = (-init).scatter_reduce(0, group_b, reward_b, reduce="amax")
    constant_b = (max_g == min_g)[group_b]
    return torch.where(constant_b, torch.zeros_like(reward_b), reward_b - mean_g[group_b])


def group_normalised(reward_b: Tensor, group_b: Tensor, eps: float) -> Tensor:
    """(r - mean) / (std + eps) within each group; std is the population std."""
    centred_b = group_centred(reward_b, group_b)
    n_groups = int(group_b.max().item()) + 1
    count_g = torch.bincount(group_b, minlength=n_groups).to(torch.float64)
    std_g = (_group_sums(centred_b**2, group_b, n_groups) / count_g.clamp(min=1.0)).sqrt()
    return centred_b / (std_g[group_b] + eps)


def leave_one_out(reward_b: Tensor, group_b: Tensor) -> Tensor:
    """r_i - mean_{j != i} r_j over the other members of i's group, which equals
    G / (G - 1) x (r_i - mean_g) for a group of G; 0 for a group of one (no other member to
    compare with) and exactly 0 for a group whose rewards are all equal."""
    centred_b = group_centred(reward_b, group_b)
    count_b = torch.bincount(group_b, minlength=int(group_b.max().item()) + 1).to(torch.float64)[group_b]
    scale_b = torch.where(count_b > 1, count_b / (count_b - 1).clamp(min=1.0), torch.zeros_like(count_b))
    return centred_b * scale_b


def batch_normalised(reward_b: Tensor, group_b: Tensor, eps: float) -> Tensor:
    """(r - mean_g) / (std_B + eps), std_B = sqrt(mean_i (r_i - mean_g(i))^2): the population
    std over every row of the batch (each sequence once) of the group-centred rewards, whose
    batch mean is exactly 0, so no second mean is subtracted."""
    centred_b = group_centred(reward_b, group_b)
    return centred_b / ((centred_b**2).mean().sqrt() + eps)


# ---------------------------------------------------------------- the PPO-clip term


def log_ratio(inputs: LossInputs) -> tuple[Tensor, Tensor]:
    """The loss-token mask and logp - old (behaviour, or the trainer's own before the update
    under a mismatch correction), forced to 0 on masked tokens."""
    on_bt = inputs.mask_bt > 0
    old_bt = inputs.behaviour_logp_bt if inputs.old_logp_bt is None else inputs.old_logp_bt
    return on_bt, torch.where(on_bt, inputs.logp_bt - old_bt, 0.0)


def clipped_policy_loss(
    inputs: LossInputs,
    weight_bt: Tensor,
    clip_low: float,
    clip_high: float,
    kl_coef: float,
    ratio_bt: Tensor | None = None,
) -> tuple[Tensor, LossStats]:
    """sum_bt weight_bt * (-min(ratio A, clip(ratio, 1-low, 1+high) A) + kl_coef k3); the ratio
    is each token's exp(logp - old) unless the caller passes its own (GSPO's sequence ratio)."""
    on_bt, log_ratio_bt = log_ratio(inputs)
    if ratio_bt is None:
        ratio_bt = log_ratio_bt.exp()
    if inputs.correction_bt is not None:
        weight_bt = weight_bt * inputs.correction_bt
    adv_bt = inputs.advantage_b.to(ratio_bt.dtype)[:, None].expand_as(ratio_bt)
    clipped_bt = ratio_bt.clamp(1.0 - clip_low, 1.0 + clip_high)
    token_loss_bt = torch.maximum(-adv_bt * ratio_bt, -adv_bt * clipped_bt)
    return _finish(inputs, weight_bt, token_loss_bt, ratio_bt, adv_bt, on_bt, (clip_low, clip_high, kl_coef))


def _finish(
    inputs: LossInputs,
    weight_bt: Tensor,
    token_loss_bt: Tensor,
    ratio_bt: Tensor,
    adv_bt: Tensor,
    on_bt: Tensor,
    clip_kl: tuple[float, float, float],
    by_sign: bool = True,
) -> tuple[Tensor, LossStats]:
    """Add kl_coef x k3, sum with the weights, and count the stats."""
    clip_low, clip_high, kl_coef = clip_kl
    kl_bt = _k3(inputs, on_bt)
    if kl_bt is not None and kl_coef > 0.0:
        token_loss_bt = token_loss_bt + kl_coef * kl_bt
    loss = (weight_bt * token_loss_bt).sum()
    return loss, _stats(ratio_bt.detach(), adv_bt, on_bt, kl_bt, clip_low, clip_high, by_sign)


def _k3(inputs: LossInputs, on_bt: Tensor) -> Tensor | None:
    """k3 estimate of KL(policy || reference): exp(d) - d - 1 with d = ref - logp."""
    if inputs.ref_logp_bt is None:
        return None
    d_bt = torch.where(on_bt, inputs.ref_logp_bt - inputs.logp_bt, 0.0)
    return d_bt.exp() - d_bt - 1.0


def _stats(
    ratio_bt: Tensor,
    adv_bt: Tensor,
    on_bt: Tensor,
    kl_bt: Tensor | None,
    clip_low: float,
    clip_high: float,
    by_sign: bool = True,
) -> LossStats:
    """by_sign: a token counts as clipped only where the clip removes its gradient (the PPO
    form); False: wherever the ratio lies outside the band (CISPO truncates the weight)."""
    low_bt = (ratio_bt < 1.0 - clip_low) & ((adv_bt < 0) | (not by_sign)) & on_bt
    high_bt = (ratio_bt > 1.0 + clip_high) & ((adv_bt > 0) | (not by_sign)) & on_bt
    ratio_max = ratio_bt.masked_fill(~on_bt, 0.0).amax() if ratio_bt.numel() else ratio_bt.new_zeros(())
    kl_sum = (kl_bt.detach() * on_bt).sum() if kl_bt is not None else ratio_bt.new_zeros(())
    sums = (on_bt.sum(), low_bt.sum(), high_bt.sum(), (ratio_bt * on_bt).sum(), ratio_max, kl_sum)
    n, lo, hi, rsum, rmax, kl = torch.stack([v.to(torch.float64) for v in sums]).tolist()
    return LossStats(n_tokens=n, clipped_low=lo, clipped_high=hi, ratio_sum=rsum, ratio_max=rmax, kl_sum=kl)


def row_clip_stats(
    logp_bt: Tensor, behaviour_logp_bt: Tensor, mask_bt: Tensor, advantage_b: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor]:
    """Per row: the mean importance ratio over its loss tokens, and the share of
    them whose gradient the clip removed (the same condition as `_stats`)."""
    on_bt = mask_bt > 0
    ratio_bt = torch.where(on_bt, logp_bt.detach() - behaviour_logp_bt, 0.0).exp()
    adv_bt = advantage_b.to(ratio_bt.dtype)[:, None].expand_as(ratio_bt)
    clipped_bt = ((ratio_bt < 1.0 - clip_low) & (adv_bt < 0) | (ratio_bt > 1.0 + clip_high) & (adv_bt > 0)) & on_bt
    n_b = on_bt.sum(-1).clamp(min=1)
    return (ratio_bt * on_bt).sum(-1) / n_b, clipped_bt.sum(-1) / n_b


# ---------------------------------------------------------------- train-inference mismatch


@dataclass(frozen=True)
class MismatchStats:
    """The gap d = logp_trainer - logp_behaviour over loss tokens, as sums (`merge` is exact)."""

    n_tokens: float = 0.0
    abs_sum: float = 0.0
    abs_max: float = 0.0
    k3_sum: float = 0.0
    """Sum of exp(d) - d - 1: its mean estimates KL(behaviour || trainer) from the sampled tokens."""
    outside: float = 0.0
    """Tokens whose ratio exp(d) lies outside [1/bound, bound]."""
    corrected: float = 0.0
    """Tokens whose weight the correction changed (tis: truncated; mask: masked)."""

    def merge(self, other: MismatchStats) -> MismatchStats:
        return MismatchStats(
            n_tokens=self.n_tokens + other.n_tokens,
            abs_sum=self.abs_sum + other.abs_sum,
            abs_max=max(self.abs_max, other.abs_max),
            k3_sum=self.k3_sum + other.k3_sum,
            outside=self.outside + other.outside,
            corrected=self.corrected + other.corrected,
        )

    def per_token(self) -> dict[str, float]:
        """The metrics row's figures: mean and max |d|, mean k3, shares outside and corrected."""
        n = self.n_tokens or 1.0
        return {
            "mismatch_abs_mean": self.abs_sum / n,
            "mismatch_abs_max": self.abs_max,
            "mismatch_k3": self.k3_sum / n,
            "mismatch_outside": self.outside / n,
            "mismatch_corrected": self.corrected / n,
        }


def mismatch(
    logp_bt: Tensor, behaviour_logp_bt: Tensor, mask_bt: Tensor, correction: str, bound: float
) -> tuple[MismatchStats, Tensor | None]:
    """The gap between the trainer's log-probs (detached here) and the behaviour log-probs over
    the loss tokens, and the correction's per-token weight factor (None for `none`): tis,
    min(exp(d), bound); mask, 1 where 1/bound <= exp(d) <= bound and 0 elsewhere."""
    on_bt = mask_bt > 0
    d_bt = torch.where(on_bt, logp_bt.detach() - behaviour_logp_bt, 0.0)
    log_bound = math.log(bound)
    outside_bt = (d_bt.abs() > log_bound) & on_bt
    factor_bt: Tensor | None = None
    changed_bt = torch.zeros_like(on_bt)
    if correction == "tis":
        changed_bt = (d_bt > log_bound) & on_bt
        factor_bt = d_bt.clamp(max=log_bound).exp()
    elif correction == "mask":
        changed_bt = outside_bt
        factor_bt = (~outside_bt).to(d_bt.dtype)
    abs_bt = d_bt.abs() * on_bt
    sums = (
        on_bt.sum(),
        abs_bt.sum(),
        abs_bt.amax() if abs_bt.numel() else abs_bt.new_zeros(()),
        ((d_bt.exp() - d_bt - 1.0) * on_bt).sum(),
        outside_bt.sum(),
        changed_bt.sum(),
    )
    n, total, top, k3, out, changed = torch.stack([v.to(torch.float64) for v in sums]).tolist()
    return MismatchStats(n, total, top, k3, out, changed), factor_bt


# ---------------------------------------------------------------- the losses


class Loss(Protocol):
    def advantages(self, reward_b: Tensor, group_b: Tensor) -> Tensor: ...

    def token_weights(self, mask_bt: Tensor, totals: BatchTotals) -> Tensor: ...

    def __call__(self, inputs: LossInputs, totals: BatchTotals) -> tuple[Tensor, LossStats]: ...

    def row_stats(self, inputs: LossInputs) -> tuple[Tensor, Tensor]:
        """Per row: its mean importance ratio and the share of its loss tokens the clip acted on."""
        ...


class _PPOClip:
    """Shared call: the subclass supplies advantages and token weights."""

    def __init__(self, config: LossConfig, kl_coef: float) -> None:
        self.config = config
        self.kl_coef = kl_coef

    def token_weights(self, mask_bt: Tensor, totals: BatchTotals) -> Tensor:
        raise NotImplementedError

    def __call__(self, inputs: LossInputs, totals: BatchTotals) -> tuple[Tensor, LossStats]:
        weight_bt = self.token_weights(inputs.mask_bt, totals)
        return clipped_policy_loss(inputs, weight_bt, self.config.clip_low, self.config.clip_high, self.kl_coef)

    def row_stats(self, inputs: LossInputs) -> tuple[Tensor, Tensor]:
        """Token ratios against the behaviour log-probs and the share the PPO clip removed."""
        c = self.config
        return row_clip_stats(
            inputs.logp_bt, inputs.behaviour_logp_bt, inputs.mask_bt, inputs.advantage_b, c.clip_low, c.clip_high
        )


class GRPOLoss(_PPOClip):
    """Group-normalised advantages; token mean per sequence, mean over sequences."""

    config: GRPOLossConfig

    def advantages(self, reward_b: Tensor, group_b: Tensor) -> Tensor:
        return group_normalised(reward_b, group_b, self.config.eps)

    def token_weights(self, mask_bt: Tensor, totals: BatchTotals) -> Tensor:
        length_b = mask_bt.sum(dim=1, keepdim=True).clamp(min=1.0)
        return mask_bt / (length_b * totals.n_sequences)


class DrGRPOLoss(_PPOClip):
    """Advantages r - mean (no std); token sum / max_completion_tokens, mean over sequences."""

    config: DrGRPOLossConfig

    def advantages(self, reward_b: Tensor, group_b: Tensor) -> Tensor:
        return group_centred(reward_b, group_b)

    def token_weights(self, mask_bt: Tensor, totals: BatchTotals) -> Tensor:
        return mask_bt / (self.config.max_completion_tokens * totals.n_sequences)


class DAPOLoss(_PPOClip):
    """Group-normalised advantages, clip-higher, mean over all tokens of the step."""

    config: DAPOLossConfig

    def advantages(self, reward_b: Tensor, group_b: Tensor) -> Tensor:
        return group_normalised(reward_b, group_b, self.config.eps)

    def token_weights(self, mask_bt: Tensor, totals: BatchTotals) -> Tensor:
        return mask_bt / max(totals.n_tokens, 1)


class RLOOLoss(_PPOClip):
    """RLOO (Ahmadian et al. 2024, "Back to Basics"): advantage r_i - mean_{j != i} r_j within
    the group (0 for a group of one); the completion is one action, so the token terms are
    summed per sequence (weight m_bt / N) and averaged over sequences. The term is TRL's
    RLOOTrainer form, PPO-clip with one update per batch ("REINFORCE / A2C is a special case of
    PPO"): on-policy the ratio is 1 and the gradient is the paper's REINFORCE estimator
    1/N sum_i A_i grad log pi(y_i | x); the clip acts only when the ratio leaves 1 (a
    train-inference mismatch, stale rows)."""

    config: RLOOLossConfig

    def advantages(self, reward_b: Tensor, group_b: Tensor) -> Tensor:
        return leave_one_out(reward_b, group_b)

    def token_weights(self, mask_bt: Tensor, totals: BatchTotals) -> Tensor:
        return mask_bt / totals.n_sequences


class ReinforcePPLoss(_PPOClip):
    """REINFORCE++-baseline (OpenRLHF `reinforce_baseline`): A_i = (r_i - mean_g(i)) /
    (std_B + eps), std_B the population std of the group-centred rewards over every row of the
    batch (each sequence counted once), the same A on each of the sequence's tokens; PPO-clip
    token terms averaged over every loss token of the step (m_bt / sum(m)). OpenRLHF whitens
    over tokens (a token-weighted mean and std); here each sequence counts once and no second
    mean is subtracted (the batch mean of group-centred rewards is exactly 0), so a group whose
    rewards are all equal keeps advantage 0 and is skipped like in every other loss."""

    config: ReinforcePPLossConfig

    def advantages(self, reward_b: Tensor, group_b: Tensor) -> Tensor:
        return batch_normalised(reward_b, group_b, self.config.eps)

    def token_weights(self, mask_bt: Tensor, totals: BatchTotals) -> Tensor:
        return mask_bt / max(totals.n_tokens, 1)


class GSPOLoss(_PPOClip):
    """GSPO (Zheng et al. 2025): group-normalised advantages and one ratio per sequence,
    s_i = exp(mean_t (logp_t - old_t)) over its loss tokens, clipped per sequence at
    [1 - clip_low, 1 + clip_high]; loss -1/N sum_i min(s_i A_i, clip(s_i) A_i). It is written
    in the token form s_i,t = sg(s_i) exp(logp_t - sg(logp_t)), weight m_bt / (L_b N): the
    value is the sequence loss and the gradient is the paper's, -A_i s_i mean_t grad logp_t
    for an unclipped sequence and 0 for a clipped one. A row never spans micro-batches, so
    each s_i is whole."""

    config: GSPOLossConfig

    def advantages(self, reward_b: Tensor, group_b: Tensor) -> Tensor:
        return group_normalised(reward_b, group_b, self.config.eps)

    def token_weights(self, mask_bt: Tensor, totals: BatchTotals) -> Tensor:
        length_b = mask_bt.sum(dim=1, keepdim=True).clamp(min=1.0)
        return mask_bt / (length_b * totals.n_sequences)

    def __call__(self, inputs: LossInputs, totals: BatchTotals) -> tuple[Tensor, LossStats]:
        weight_bt = self.token_weights(inputs.mask_bt, totals)
        ratio_bt = self._token_ratio(inputs)
        c = self.config
        return clipped_policy_loss(inputs, weight_bt, c.clip_low, c.clip_high, self.kl_coef, ratio_bt)

    def _token_ratio(self, inputs: LossInputs) -> Tensor:
        """sg(s_i) exp(logp_t - sg(logp_t)): value s_i on every token, gradient s_i grad logp_t."""
        seq_b = self.sequence_ratio(inputs)
        logp_bt = inputs.logp_bt
        return seq_b.detach()[:, None] * (logp_bt - logp_bt.detach()).exp()

    @staticmethod
    def sequence_ratio(inputs: LossInputs) -> Tensor:
        """s_i = exp(mean over the row's loss tokens of logp - old) (1 for a row without any)."""
        on_bt, log_ratio_bt = log_ratio(inputs)
        return (log_ratio_bt.sum(-1) / on_bt.sum(-1).clamp(min=1)).exp()

    def row_stats(self, inputs: LossInputs) -> tuple[Tensor, Tensor]:
        """The sequence ratio, and 1 for a sequence the clip removed (0 otherwise)."""
        with torch.no_grad():
            seq_b = self.sequence_ratio(inputs)
        adv_b = inputs.advantage_b.to(seq_b.dtype)
        c = self.config
        clipped_b = (seq_b < 1.0 - c.clip_low) & (adv_b < 0) | (seq_b > 1.0 + c.clip_high) & (adv_b > 0)
        return seq_b, clipped_b.to(seq_b.dtype)


class CISPOLoss(_PPOClip):
    """CISPO (MiniMax-M1, 2025): group-normalised advantages; each token's term is
    -sg(clip(r_t, 1 - clip_low, 1 + clip_high)) A_i logp_t, r_t = exp(logp_t - old_t), averaged
    over every loss token of the step (m_bt / sum(m), the paper's 1 / sum_i |o_i|). The clip
    bounds the weight, not the gradient: every token keeps gradient -w_t A_i. Its clip stats
    count tokens whose weight the clip truncated (either side, either sign of A). The loss value
    carries logp, so it is not 0 on-policy as the PPO forms are."""

    config: CISPOLossConfig

    def advantages(self, reward_b: Tensor, group_b: Tensor) -> Tensor:
        return group_normalised(reward_b, group_b, self.config.eps)

    def token_weights(self, mask_bt: Tensor, totals: BatchTotals) -> Tensor:
        return mask_bt / max(totals.n_tokens, 1)

    def __call__(self, inputs: LossInputs, totals: BatchTotals) -> tuple[Tensor, LossStats]:
        c = self.config
        weight_bt = self.token_weights(inputs.mask_bt, totals)
        if inputs.correction_bt is not None:
            weight_bt = weight_bt * inputs.correction_bt
        on_bt, log_ratio_bt = log_ratio(inputs)
        ratio_bt = log_ratio_bt.detach().exp()
        is_weight_bt = ratio_bt.clamp(1.0 - c.clip_low, 1.0 + c.clip_high)
        adv_bt = inputs.advantage_b.to(ratio_bt.dtype)[:, None].expand_as(ratio_bt)
        logp_bt = torch.where(on_bt, inputs.logp_bt, 0.0)
        token_loss_bt = -is_weight_bt * adv_bt * logp_bt
        clip_kl = (c.clip_low, c.clip_high, self.kl_coef)
        return _finish(inputs, weight_bt, token_loss_bt, ratio_bt, adv_bt, on_bt, clip_kl, by_sign=False)

    def row_stats(self, inputs: LossInputs) -> tuple[Tensor, Tensor]:
        """Token ratios against the behaviour log-probs and the share whose weight was truncated."""
        on_bt = inputs.mask_bt > 0
        ratio_bt = torch.where(on_bt, inputs.logp_bt.detach() - inputs.behaviour_logp_bt, 0.0).exp()
        c = self.config
        cut_bt = ((ratio_bt < 1.0 - c.clip_low) | (ratio_bt > 1.0 + c.clip_high)) & on_bt
        n_b = on_bt.sum(-1).clamp(min=1)
        return (ratio_bt * on_bt).sum(-1) / n_b, cut_bt.sum(-1) / n_b


LOSSES: dict[str, Callable[..., Loss]] = {
    "grpo": GRPOLoss,
    "dr_grpo": DrGRPOLoss,
    "dapo": DAPOLoss,
    "rloo": RLOOLoss,
    "reinforce_pp": ReinforcePPLoss,
    "gspo": GSPOLoss,
    "cispo": CISPOLoss,
}


def build_loss(config: LossConfig, kl_coef: float = 0.0) -> Loss:
    """The loss named by `config.type` (an explicit table, no string chain)."""
    return LOSSES[config.type](config, kl_coef)
