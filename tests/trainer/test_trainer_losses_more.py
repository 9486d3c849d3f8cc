"""RLOO, REINFORCE++-baseline, GSPO and CISPO against values derived by hand.

The shared example of test_trainer_losses.py: 2 groups of 2 sequences, 3 completion tokens.

  row  group reward  mask      ratio (exp(logp_new - logp_behaviour)), logp = -2 + ln ratio
  0    0     1.0     [1,1,1]   [1.0, 1.5,  0.5]
  1    0     0.0     [1,1,0]   [1.5, 0.5, (3.0 masked)]
  2    1     1.0     [1,1,1]   [1.1, 1.25, 1.0]
  3    1     0.5     [1,0,0]   [0.7, (2.0, 2.0 masked)]

Group-normalised advantages (GSPO, CISPO): [b, -b, a, -a], b = 0.5/(0.5+eps), a = 0.25/(0.25+eps).
"""

from __future__ import annotations

import math

import pytest
import torch
import trainer_testlib  # noqa: F401  (sets OMP threads before torch)
from trainer_testlib import BEHAVIOUR_BT, EPS, GROUP_B, MASK_BT, RATIO_BT, REWARD_B, TOTALS, a, b

from posttrain.configs.trainer import (
    CISPOLossConfig,
    DAPOLossConfig,
    GRPOLossConfig,
    GSPOLossConfig,
    ReinforcePPLossConfig,
    RLOOLossConfig,
    load_trainer_config,
)
from posttrain.errors import ConfigError
from posttrain.trainer.losses import (
    CISPOLoss,
    GRPOLoss,
    GSPOLoss,
    LossInputs,
    ReinforcePPLoss,
    RLOOLoss,
    batch_normalised,
    build_loss,
    leave_one_out,
)

NEW = [RLOOLossConfig(), ReinforcePPLossConfig(eps=EPS), GSPOLossConfig(eps=EPS), CISPOLossConfig(eps=EPS)]


def inputs(advantage_b, rows=slice(None), **extra):
    logp_bt = (BEHAVIOUR_BT + RATIO_BT.log())[rows].clone().requires_grad_(True)
    return LossInputs(
        logp_bt=logp_bt,
        behaviour_logp_bt=BEHAVIOUR_BT[rows],
        mask_bt=MASK_BT[rows],
        advantage_b=advantage_b[rows],
        **{k: v[rows] for k, v in extra.items()},
    )


def lp(r: float) -> float:
    return -2.0 + math.log(r)


# ---------------------------------------------------------------- advantages


def test_leave_one_out_by_hand():
    # pairs: r_i - r_other -> [1, -1, 0.5, -0.5]
    assert leave_one_out(REWARD_B, GROUP_B).tolist() == pytest.approx([1.0, -1.0, 0.5, -0.5], abs=1e-12)
    # a group of 3 [1, 0, 0]: baselines 0, 0.5, 0.5 -> [1, -0.5, -0.5]; a group of one -> 0;
    # a constant group [0.3, 0.3] -> exactly 0
    reward = torch.tensor([1.0, 0.0, 0.0, 0.9, 0.3, 0.3])
    group = torch.tensor([0, 0, 0, 1, 2, 2])
    adv = leave_one_out(reward, group)
    assert adv[:3].tolist() == pytest.approx([1.0, -0.5, -0.5], abs=1e-12)
    assert adv[3:].tolist() == [0.0, 0.0, 0.0]


def test_reinforce_pp_batch_std_by_hand():
    # centred [0.5, -0.5, 0.25, -0.25] plus a constant group [0.7, 0.7] -> [0, 0]
    # batch std over the 6 rows: sqrt((0.25 + 0.25 + 0.0625 + 0.0625) / 6) = sqrt(0.625 / 6)
    reward = torch.tensor([1.0, 0.0, 1.0, 0.5, 0.7, 0.7])
    group = torch.tensor([0, 0, 1, 1, 2, 2])
    std = math.sqrt(0.625 / 6)
    want = [c / (std + EPS) for c in (0.5, -0.5, 0.25, -0.25)] + [0.0, 0.0]
    adv = batch_normalised(reward, group, EPS)
    assert adv.tolist() == pytest.approx(want, abs=1e-12)
    assert adv[4:].tolist() == [0.0, 0.0]  # exactly zero: the group is skipped
    # unlike GRPO, both groups share one scale: group 1's advantages stay half of group 0's
    assert adv[2].item() == pytest.approx(adv[0].item() / 2, abs=1e-12)


# ---------------------------------------------------------------- losses


def test_rloo_by_hand():
    # A = [1, -1, 0.5, -0.5], clip 0.2; token sums per sequence, / N = 4:
    # row0 (A=+1): -(1 + 1.2 + 0.5) = -2.7; row1 (A=-1): 1.5 + 0.8 = 2.3
    # row2 (A=+.5): -0.5 (1.1 + 1.2 + 1) = -1.65; row3 (A=-.5): 0.5 x 0.8 = 0.4
    # -> (-2.7 + 2.3 - 1.65 + 0.4) / 4 = -0.4125
    loss_fn = RLOOLoss(RLOOLossConfig(), kl_coef=0.0)
    adv = loss_fn.advantages(REWARD_B, GROUP_B).float()
    x = inputs(adv)
    loss, stats = loss_fn(x, TOTALS)
    assert loss.item() == pytest.approx(-0.4125, abs=1e-6)
    assert (stats.clipped_low, stats.clipped_high) == (2, 2)
    # on-policy REINFORCE: a token inside the band gets d/dlogp = -r A / N (row0 token0: -1/4)
    loss.backward()
    assert x.logp_bt.grad[0, 0].item() == pytest.approx(-0.25, abs=1e-6)


def test_reinforce_pp_by_hand():
    # A = c / s, c = [0.5, -0.5, 0.25, -0.25], s = sqrt(0.625 / 4) (+eps); clip 0.2; mean over 9 tokens:
    # (-2.7 x 0.5 + 2.3 x 0.5 - 3.3 x 0.25 + 0.8 x 0.25) / s / 9 = -0.825 / s / 9
    s = math.sqrt(0.625 / 4) + EPS
    loss_fn = ReinforcePPLoss(ReinforcePPLossConfig(eps=EPS), kl_coef=0.0)
    adv = loss_fn.advantages(REWARD_B, GROUP_B).float()
    loss, _ = loss_fn(inputs(adv), TOTALS)
    assert loss.item() == pytest.approx(-0.825 / s / 9, abs=1e-6)


def test_gspo_by_hand():
    # sequence ratios, the geometric mean over loss tokens:
    #   s0 = (1 x 1.5 x 0.5)^(1/3) = 0.75^(1/3) = 0.9086; s1 = (1.5 x 0.5)^(1/2) = 0.8660
    #   s2 = (1.1 x 1.25)^(1/3) = 1.375^(1/3) = 1.1120;   s3 = 0.7
    # clip [1 - 3e-4, 1 + 4e-4]: row0 A>0, s0 below 1: unclipped -> -b s0
    #   row1 A<0, s1 below the band: clipped -> +b (1 - 3e-4); row2 A>0, above: -a (1 + 4e-4)
    #   row3 A<0, below: +a (1 - 3e-4); loss = mean over the 4 sequences
    s0 = 0.75 ** (1 / 3)
    loss_fn = GSPOLoss(GSPOLossConfig(eps=EPS), kl_coef=0.0)
    adv = loss_fn.advantages(REWARD_B, GROUP_B).float()
    x = inputs(adv)
    loss, stats = loss_fn(x, TOTALS)
    want = (-b * s0 + b * (1 - 3e-4) - a * (1 + 4e-4) + a * (1 - 3e-4)) / 4
    assert loss.item() == pytest.approx(want, abs=1e-6)
    # stats: tokens of clipped sequences (row1's 2 low, row3's 1 low, row2's 3 high)
    assert (stats.clipped_low, stats.clipped_high) == (3, 3)
    seq_b, clipped_b = loss_fn.row_stats(x)
    assert seq_b.tolist() == pytest.approx([s0, 0.75**0.5, 1.375 ** (1 / 3), 0.7], abs=1e-6)
    assert clipped_b.tolist() == [0.0, 1.0, 1.0, 1.0]
    # the gradient is the sequence form's: d/dlogp_t (-b s0 / 4) = -b s0 / (3 x 4) on each of
    # row0's tokens, 0 on every token of a clipped sequence
    loss.backward()
    assert x.logp_bt.grad[0].tolist() == pytest.approx([-b * s0 / 12] * 3, abs=1e-6)
    assert x.logp_bt.grad[1:].abs().max().item() == 0.0


def test_gspo_token_form_matches_the_sequence_form():
    # the same loss written at sequence level, -1/N sum_i min(s_i A_i, clip(s_i) A_i), with
    # s_i = exp(mean_t (logp - old)), gives the same value and gradient (wide clip: some clip, some not)
    config = GSPOLossConfig(clip_low=0.2, clip_high=0.1, eps=EPS)
    loss_fn = GSPOLoss(config, kl_coef=0.0)
    adv = loss_fn.advantages(REWARD_B, GROUP_B).float()
    x, y = inputs(adv), inputs(adv)
    loss, _ = loss_fn(x, TOTALS)
    loss.backward()
    d = torch.where(MASK_BT > 0, y.logp_bt - BEHAVIOUR_BT, 0.0)
    s_b = (d.sum(-1) / MASK_BT.sum(-1)).exp()
    seq = -torch.minimum(s_b * adv, s_b.clamp(0.8, 1.1) * adv).sum() / 4
    seq.backward()
    assert loss.item() == pytest.approx(seq.item(), abs=1e-6)
    torch.testing.assert_close(x.logp_bt.grad, y.logp_bt.grad, rtol=0.0, atol=1e-6)


def test_cispo_by_hand():
    # weights w = sg(clip(r, 1 - 1.0, 1 + 0.28)) = min(r, 1.28); term -w A logp; mean over 9 tokens
    # row0 (A=b):  -b (1 x lp(1) + 1.28 lp(1.5) + 0.5 lp(0.5));  row1 (A=-b): +b (1.28 lp(1.5) + 0.5 lp(0.5))
    # row2 (A=a):  -a (1.1 lp(1.1) + 1.25 lp(1.25) + 1 lp(1));    row3 (A=-a): +a (0.7 lp(0.7))
    loss_fn = CISPOLoss(CISPOLossConfig(eps=EPS), kl_coef=0.0)
    adv = loss_fn.advantages(REWARD_B, GROUP_B).float()
    x = inputs(adv)
    loss, stats = loss_fn(x, TOTALS)
    want = (
        -b * (lp(1) + 1.28 * lp(1.5) + 0.5 * lp(0.5))
        + b * (1.28 * lp(1.5) + 0.5 * lp(0.5))
        - a * (1.1 * lp(1.1) + 1.25 * lp(1.25) + lp(1))
        + a * 0.7 * lp(0.7)
    ) / 9
    assert loss.item() == pytest.approx(want, abs=1e-6)
    assert (stats.clipped_low, stats.clipped_high) == (0, 2)  # the two 1.5 ratios truncated to 1.28
    # every token keeps its gradient -w A / 9, also where PPO's clip would remove it:
    # row0 token1 (ratio 1.5, A > 0) gets -1.28 b / 9; row1 token1 (ratio 0.5, A < 0) gets +0.5 b / 9
    loss.backward()
    assert x.logp_bt.grad[0, 1].item() == pytest.approx(-1.28 * b / 9, abs=1e-6)
    assert x.logp_bt.grad[1, 1].item() == pytest.approx(0.5 * b / 9, abs=1e-6)
    y = inputs(adv)
    GRPOLoss(GRPOLossConfig(eps=EPS), 0.0)(y, TOTALS)[0].backward()
    assert y.logp_bt.grad[0, 1].item() == y.logp_bt.grad[1, 1].item() == 0.0  # where the PPO clip drops them


def test_cispo_lower_bound_truncates_when_set():
    # clip_low 0.2: row1 token1 ratio 0.5 -> weight 0.8 (and row0 token2, row3 token0 0.7 -> 0.8)
    loss_fn = CISPOLoss(CISPOLossConfig(clip_low=0.2, eps=EPS), kl_coef=0.0)
    adv = loss_fn.advantages(REWARD_B, GROUP_B).float()
    x = inputs(adv)
    loss, stats = loss_fn(x, TOTALS)
    loss.backward()
    assert x.logp_bt.grad[1, 1].item() == pytest.approx(0.8 * b / 9, abs=1e-6)
    assert stats.clipped_low == 3


# ---------------------------------------------------------------- shared machinery with each loss


@pytest.mark.parametrize("config", NEW, ids=lambda c: c.type)
def test_micro_batches_sum_to_the_full_batch(config):
    loss_fn = build_loss(config, kl_coef=0.05)
    adv = loss_fn.advantages(REWARD_B, GROUP_B).float()
    ref = BEHAVIOUR_BT + 0.3
    full, _ = loss_fn(inputs(adv, ref_logp_bt=ref), TOTALS)
    parts = [loss_fn(inputs(adv, rows=s, ref_logp_bt=ref), TOTALS)[0] for s in (slice(0, 1), slice(1, 4))]
    assert (parts[0] + parts[1]).item() == pytest.approx(full.item(), abs=1e-7)


@pytest.mark.parametrize("config", NEW, ids=lambda c: c.type)
def test_kl_adds_kl_coef_k3_under_each_loss_weights(config):
    # ref = logp + ln 2 everywhere: k3 = 1 - ln 2 per token; the loss grows by
    # kl_coef (1 - ln 2) x sum of the loss's token weights
    loss_fn, plain = build_loss(config, kl_coef=0.1), build_loss(config, kl_coef=0.0)
    adv = loss_fn.advantages(REWARD_B, GROUP_B).float()
    ref = BEHAVIOUR_BT + RATIO_BT.log() + math.log(2.0)
    with_kl, stats = loss_fn(inputs(adv, ref_logp_bt=ref), TOTALS)
    without, _ = plain(inputs(adv), TOTALS)
    weight_sum = loss_fn.token_weights(MASK_BT, TOTALS).sum().item()
    assert with_kl.item() - without.item() == pytest.approx(0.1 * (1 - math.log(2.0)) * weight_sum, abs=1e-6)
    assert stats.kl_mean == pytest.approx(1 - math.log(2.0), abs=1e-6)


@pytest.mark.parametrize("config", NEW, ids=lambda c: c.type)
def test_mismatch_correction_weights_each_loss(config):
    # under a correction the ratio is taken against old_logp (here the current log-probs: ratio 1)
    # and each token's weight is multiplied by its factor; a factor of 0 on row 0 leaves the
    # loss of rows 1-3 alone, and a factor of 2 everywhere doubles the loss
    loss_fn = build_loss(config, kl_coef=0.0)
    adv = loss_fn.advantages(REWARD_B, GROUP_B).float()
    old = BEHAVIOUR_BT + RATIO_BT.log()
    ones, zero_row0 = torch.ones(4, 3), torch.ones(4, 3)
    zero_row0[0] = 0.0
    full, _ = loss_fn(inputs(adv, old_logp_bt=old, correction_bt=ones), TOTALS)
    doubled, _ = loss_fn(inputs(adv, old_logp_bt=old, correction_bt=2 * ones), TOTALS)
    cut, _ = loss_fn(inputs(adv, old_logp_bt=old, correction_bt=zero_row0), TOTALS)
    rest, _ = loss_fn(inputs(adv, rows=slice(1, 4), old_logp_bt=old, correction_bt=ones), TOTALS)
    assert doubled.item() == pytest.approx(2 * full.item(), abs=1e-6)
    assert cut.item() == pytest.approx(rest.item(), abs=1e-7)
    assert full.item() != pytest.approx(rest.item(), abs=1e-3)  # row 0 did contribute


@pytest.mark.parametrize("config", NEW, ids=lambda c: c.type)
def test_masked_tokens_cannot_poison_the_loss(config):
    big = BEHAVIOUR_BT.clone()
    big[MASK_BT == 0] = -1000.0
    loss_fn = build_loss(config)
    adv = loss_fn.advantages(REWARD_B, GROUP_B).float()
    x = inputs(adv)
    poisoned = LossInputs(logp_bt=x.logp_bt, behaviour_logp_bt=big, mask_bt=MASK_BT, advantage_b=adv)
    value = loss_fn(poisoned, TOTALS)[0]
    assert math.isfinite(value.item()) and value.item() == pytest.approx(loss_fn(x, TOTALS)[0].item(), abs=0.0)


@pytest.mark.parametrize(
    "loss, field",
    [
        ({"type": "gspo", "clip_low": 1.5}, "trainer.loss.gspo.clip_low"),
        ({"type": "gspo", "clip_high": 0.0}, "trainer.loss.gspo.clip_high"),
        ({"type": "cispo", "clip_low": 1.2}, "trainer.loss.cispo.clip_low"),
        ({"type": "reinforce_pp", "eps": -1.0}, "trainer.loss.reinforce_pp.eps"),
        ({"type": "rloo", "eps": 1e-6}, "trainer.loss.rloo.eps"),  # RLOO has no std to add it to
        ({"type": "reinforce"}, "trainer.loss"),
    ],
)
def test_bad_loss_config_names_the_field(loss, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_trainer_config({"loss": loss})


def test_new_losses_parse_with_their_defaults():
    gspo = load_trainer_config({"loss": {"type": "gspo"}}).loss
    assert (gspo.clip_low, gspo.clip_high) == (3e-4, 4e-4)
    cispo = load_trainer_config({"loss": {"type": "cispo"}}).loss
    assert (cispo.clip_low, cispo.clip_high) == (1.0, 0.28)
    assert isinstance(build_loss(load_trainer_config({"loss": {"type": "rloo"}}).loss), RLOOLoss)
    assert isinstance(build_loss(load_trainer_config({"loss": {"type": "reinforce_pp"}}).loss), ReinforcePPLoss)


def test_on_policy_gspo_is_grpo_and_cispo_is_dapo_in_gradient():
    # with every ratio exactly 1 (one update per batch, no mismatch): s_i = 1 inside GSPO's band,
    # so its gradient -A_i mean_t grad logp_t / N is GRPO's; CISPO's weight is 1, so its gradient
    # -A_i grad logp_t / sum(m) is DAPO's. Only the loss values differ (CISPO's carries logp)
    def grad(config):
        loss_fn = build_loss(config)
        adv = loss_fn.advantages(REWARD_B, GROUP_B).float()
        logp = (BEHAVIOUR_BT + RATIO_BT.log()).clone().requires_grad_(True)
        x = LossInputs(logp_bt=logp, behaviour_logp_bt=logp.detach(), mask_bt=MASK_BT, advantage_b=adv)
        loss_fn(x, TOTALS)[0].backward()
        return logp.grad

    torch.testing.assert_close(grad(GSPOLossConfig(eps=EPS)), grad(GRPOLossConfig(eps=EPS)), rtol=0, atol=1e-7)
    torch.testing.assert_close(grad(CISPOLossConfig(eps=EPS)), grad(DAPOLossConfig(eps=EPS)), rtol=0, atol=1e-7)
    assert grad(CISPOLossConfig(eps=EPS)).abs().max() > 0
