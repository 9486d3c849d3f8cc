"""Each loss against values derived by hand.

The shared example: 2 groups of 2 sequences, 3 completion tokens each.

  row  group reward  mask      ratio (exp(logp_new - logp_behaviour))
  0    0     1.0     [1,1,1]   [1.0, 1.5,  0.5]
  1    0     0.0     [1,1,0]   [1.5, 0.5, (3.0 masked)]
  2    1     1.0     [1,1,1]   [1.1, 1.25, 1.0]
  3    1     0.5     [1,0,0]   [0.7, (2.0, 2.0 masked)]

Group 0: mean 0.5, centred +-0.5, population std 0.5 -> A = +-b, b = 0.5/(0.5+eps)
Group 1: mean 0.75, centred +-0.25, std 0.25        -> A = +-a, a = 0.25/(0.25+eps)
Token loss l = -min(r A, clip(r, 1-lo, 1+hi) A); with A > 0 the clip binds
above 1+hi, with A < 0 below 1-lo.
"""

from __future__ import annotations

import math

import pytest
import torch
import trainer_testlib  # noqa: F401  (sets OMP threads before torch)
from trainer_testlib import BEHAVIOUR_BT, EPS, GROUP_B, MASK_BT, RATIO_BT, REWARD_B, TOTALS, a, b

from posttrain.configs.trainer import DAPOLossConfig, DrGRPOLossConfig, GRPOLossConfig
from posttrain.trainer.losses import (
    LOSSES,
    BatchTotals,
    DAPOLoss,
    DrGRPOLoss,
    GRPOLoss,
    LossInputs,
    build_loss,
    group_centred,
    group_normalised,
)


def inputs(advantage_b, ref_logp_bt=None, rows=slice(None)):
    logp_bt = (BEHAVIOUR_BT + RATIO_BT.log())[rows].clone().requires_grad_(True)
    return LossInputs(
        logp_bt=logp_bt,
        behaviour_logp_bt=BEHAVIOUR_BT[rows],
        mask_bt=MASK_BT[rows],
        advantage_b=advantage_b[rows],
        ref_logp_bt=None if ref_logp_bt is None else ref_logp_bt[rows],
    )


def test_advantages_by_hand():
    assert group_normalised(REWARD_B, GROUP_B, EPS).tolist() == pytest.approx([b, -b, a, -a], abs=1e-12)
    assert group_centred(REWARD_B, GROUP_B).tolist() == pytest.approx([0.5, -0.5, 0.25, -0.25], abs=1e-12)
    # interleaved group ids, and a constant group whose float mean is not exactly 0.1
    reward = torch.tensor([0.1, 1.0, 0.1, 0.0, 0.1])
    group = torch.tensor([0, 1, 0, 1, 0])
    assert group_normalised(reward, group, EPS).tolist() == pytest.approx([0, b, 0, -b, 0], abs=1e-12)
    assert group_centred(reward, group)[[0, 2, 4]].tolist() == [0.0, 0.0, 0.0]  # exactly zero


def test_grpo_by_hand():
    # row 0 (A=+b): -b*1, -b*1.2 (clipped), -b*0.5           -> mean -2.7b/3 = -0.9b
    # row 1 (A=-b): +b*1.5 (unclipped side), +b*0.8 (clipped) -> mean 2.3b/2 = 1.15b
    # row 2 (A=+a): -a*1.1, -a*1.2 (1.25 clipped), -a*1      -> mean -3.3a/3 = -1.1a
    # row 3 (A=-a): +a*0.8 (0.7 clipped)                      -> 0.8a
    # loss = mean over the 4 sequences
    loss_fn = GRPOLoss(GRPOLossConfig(eps=EPS), kl_coef=0.0)
    adv = loss_fn.advantages(REWARD_B, GROUP_B).float()
    loss, stats = loss_fn(inputs(adv), TOTALS)
    assert loss.item() == pytest.approx((-0.9 * b + 1.15 * b - 1.1 * a + 0.8 * a) / 4, abs=1e-6)
    # clipped: row0 1.5 (high), row2 1.25 (high), row1 0.5 (low), row3 0.7 (low) -> 4 of 9
    assert (stats.clipped_low, stats.clipped_high, stats.n_tokens) == (2, 2, 9)
    assert stats.clip_frac == pytest.approx(4 / 9, abs=1e-12)
    assert stats.ratio_mean == pytest.approx((3.0 + 2.0 + 3.35 + 0.7) / 9, abs=1e-6)
    assert stats.ratio_max == pytest.approx(1.5, abs=1e-6)  # masked 3.0 and 2.0 ignored
    assert stats.kl_mean == 0.0


def test_dr_grpo_by_hand():
    # A = [0.5, -0.5, 0.25, -0.25]; token sums: row0 -2.7*0.5 = -1.35, row1 2.3*0.5 = 1.15,
    # row2 -3.3*0.25 = -0.825, row3 0.8*0.25 = 0.2; each / max_completion_tokens (4), mean over 4
    # -> (-1.35 + 1.15 - 0.825 + 0.2) / 16 = -0.825 / 16 = -0.0515625
    loss_fn = DrGRPOLoss(DrGRPOLossConfig(max_completion_tokens=4), kl_coef=0.0)
    adv = loss_fn.advantages(REWARD_B, GROUP_B).float()
    loss, _ = loss_fn(inputs(adv), TOTALS)
    assert loss.item() == pytest.approx(-0.0515625, abs=1e-6)


def test_dapo_by_hand():
    # clip-higher 0.28: row0 -b(1 + 1.28 + 0.5) = -2.78b; row1 b(1.5 + 0.8) = 2.3b;
    # row2 -a(1.1 + 1.25 + 1) = -3.35a (1.25 < 1.28: not clipped now); row3 0.8a
    # token mean over all 9 tokens of the batch
    loss_fn = DAPOLoss(DAPOLossConfig(eps=EPS), kl_coef=0.0)
    adv = loss_fn.advantages(REWARD_B, GROUP_B).float()
    loss, stats = loss_fn(inputs(adv), TOTALS)
    assert loss.item() == pytest.approx((-2.78 * b + 2.3 * b - 3.35 * a + 0.8 * a) / 9, abs=1e-6)
    assert (stats.clipped_low, stats.clipped_high) == (2, 1)


def test_kl_k3_by_hand():
    # ref = logp + ln 2 on every token: k3 = e^{ln 2} - ln 2 - 1 = 1 - ln 2 per token;
    # GRPO weights average it to 1 - ln 2; loss grows by kl_coef (1 - ln 2)
    loss_fn = GRPOLoss(GRPOLossConfig(eps=EPS), kl_coef=0.1)
    adv = loss_fn.advantages(REWARD_B, GROUP_B).float()
    ref = BEHAVIOUR_BT + RATIO_BT.log() + math.log(2.0)
    loss, stats = loss_fn(inputs(adv, ref), TOTALS)
    base = (-0.9 * b + 1.15 * b - 1.1 * a + 0.8 * a) / 4
    assert loss.item() == pytest.approx(base + 0.1 * (1 - math.log(2.0)), abs=1e-6)
    assert stats.kl_mean == pytest.approx(1 - math.log(2.0), abs=1e-6)


@pytest.mark.parametrize(
    "advantage, ratio, loss, grad",
    [
        (+1.0, 1.5, -1.2, 0.0),  # A > 0, above 1 + 0.2: clipped, no gradient
        (+1.0, 1.1, -1.1, -1.1),  # inside the band: d(-rA)/dlogp = -rA
        (+1.0, 0.5, -0.5, -0.5),  # A > 0 below the band: not clipped
        (-1.0, 0.5, 0.8, 0.0),  # A < 0, below 1 - 0.2: clipped, no gradient
        (-1.0, 1.5, 1.5, 1.5),  # A < 0 above the band: not clipped (pessimistic bound)
    ],
)
def test_ppo_clip_both_sides(advantage, ratio, loss, grad):
    logp = torch.tensor([[math.log(ratio) - 1.0]], requires_grad=True)
    x = LossInputs(
        logp_bt=logp,
        behaviour_logp_bt=torch.tensor([[-1.0]]),
        mask_bt=torch.ones(1, 1),
        advantage_b=torch.tensor([advantage]),
    )
    value, stats = GRPOLoss(GRPOLossConfig(), 0.0)(x, BatchTotals(1, 1))
    value.backward()
    assert value.item() == pytest.approx(loss, abs=1e-6)
    assert logp.grad.item() == pytest.approx(grad, abs=1e-6)
    assert stats.clip_frac == (1.0 if grad == 0.0 else 0.0)


@pytest.mark.parametrize("config", [GRPOLossConfig(), DrGRPOLossConfig(max_completion_tokens=5), DAPOLossConfig()])
def test_micro_batches_sum_to_the_full_batch(config):
    loss_fn = build_loss(config, kl_coef=0.05)
    adv = loss_fn.advantages(REWARD_B, GROUP_B).float()
    ref = BEHAVIOUR_BT + 0.3
    full, _ = loss_fn(inputs(adv, ref), TOTALS)
    parts = [loss_fn(inputs(adv, ref, rows=s), TOTALS)[0] for s in (slice(0, 1), slice(1, 4))]
    assert (parts[0] + parts[1]).item() == pytest.approx(full.item(), abs=1e-7)


def test_masked_tokens_cannot_poison_the_loss():
    big = BEHAVIOUR_BT.clone()
    big[MASK_BT == 0] = -1000.0  # a placeholder behaviour log-prob on tool tokens
    loss_fn = DAPOLoss(DAPOLossConfig(), 0.0)
    adv = loss_fn.advantages(REWARD_B, GROUP_B).float()
    x = inputs(adv)
    poisoned = LossInputs(logp_bt=x.logp_bt, behaviour_logp_bt=big, mask_bt=MASK_BT, advantage_b=adv)
    assert loss_fn(poisoned, TOTALS)[0].item() == pytest.approx(loss_fn(x, TOTALS)[0].item(), abs=0.0)


def test_losses_are_chosen_from_the_table():
    assert set(LOSSES) == {"grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp", "gspo", "cispo"}
    assert isinstance(build_loss(DAPOLossConfig()), DAPOLoss)
    assert isinstance(build_loss(DrGRPOLossConfig(max_completion_tokens=8)), DrGRPOLoss)
