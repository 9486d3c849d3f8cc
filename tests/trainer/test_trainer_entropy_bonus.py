"""The entropy bonus (trainer.entropy_bonus): its value by hand, every loss gets it, and it trains
groups without signal towards higher entropy."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from trainer_testlib import reference_logprobs, synthetic_batch, tiny_model

from posttrain.configs.trainer import TrainerConfig
from posttrain.trainer.batch import TrainBatch
from posttrain.trainer.trainer import Trainer, entropy_bonus


def test_entropy_bonus_by_hand():
    # two loss tokens: row 0 (coef 0.1) with p = (0.5, 0.5), H = ln 2; row 1 (coef 0) with
    # p = (0.9, 0.1), H = -(0.9 ln 0.9 + 0.1 ln 0.1) = 0.325083; the step has 4 loss tokens:
    # bonus = 0.1 x ln 2 / 4 = 0.0173287; entropy summed over both tokens: 1.0182302
    logp_nv = torch.tensor([[0.5, 0.5], [0.9, 0.1]]).log().requires_grad_()
    rows = [_row(0.1), _row(0.0)]
    bonus, entropy_sum = entropy_bonus(logp_nv, rows, torch.tensor([0, 1]), 4)
    assert bonus is not None and float(bonus.detach()) == pytest.approx(0.1 * math.log(2) / 4, abs=1e-7)
    assert entropy_sum == pytest.approx(1.0182302, abs=1e-6)
    bonus.backward()
    assert logp_nv.grad is not None and torch.all(logp_nv.grad[1] == 0)  # coef 0: no gradient
    assert entropy_bonus(logp_nv.detach(), [_row(0.0), _row(0.0)], torch.tensor([0, 1]), 4)[0] is None


def _row(coef: float):
    batch = synthetic_batch(seed=0)
    return dataclasses.replace(batch.rows[0], entropy_coef=coef)


def _no_signal_batch(model, coef: float) -> TrainBatch:
    """synthetic_batch's last group (all rewards 1: no signal), on-policy, with `coef` on every row."""
    rows = [r for r in synthetic_batch(seed=5).rows if r.group_id == "g2"]
    return TrainBatch(
        tuple(
            dataclasses.replace(
                r, behaviour_logprobs=reference_logprobs(model, r.prompt_ids, r.completion_ids), entropy_coef=coef
            )
            for r in rows
        )
    )


@pytest.mark.parametrize("loss", [{"type": "grpo"}, {"type": "dapo"}, {"type": "dr_grpo", "max_completion_tokens": 8}])
def test_a_group_without_signal_trains_on_the_entropy_term_only(loss):
    model = tiny_model(1)
    trainer = Trainer(model, TrainerConfig.model_validate({"loss": loss, "lr": 1e-2}))
    off = trainer.step(_no_signal_batch(model, 0.0))
    assert off.outcome == "coasted" and off.entropy_bonus == 0.0 and off.n_sequences == 0
    first = trainer.step(_no_signal_batch(model, 0.05))
    assert first.outcome == "applied" and first.n_sequences == 4
    # every row has coef 0.05 and enters the loss: the term is 0.05 x the mean token entropy,
    # and with advantage 0 the policy term is 0, so the loss is minus the term
    assert first.entropy_bonus == pytest.approx(0.05 * first.entropy, rel=1e-5)
    assert first.loss == pytest.approx(-first.entropy_bonus, rel=1e-5)
    for _ in range(3):
        last = trainer.step(_no_signal_batch(model, 0.05))
    assert last.entropy > first.entropy  # the bonus raised the policy's entropy on these tokens
