"""The train-inference mismatch: its metric and its optional correction, by hand.

Two rows of one group (rewards 1 and 0, so GRPO advantages are +-a with a = 0.5 / (0.5 + 1e-6)),
four completion tokens each. Row 0's behaviour log-probs are the trainer's own plus
delta = (0, 0.5, -1, 0.1), so d = logp_trainer - logp_behaviour = (0, -0.5, 1, -0.1); row 1's
equal the trainer's (d = 0). Over the 8 tokens:
  mean |d| = (0 + 0.5 + 1 + 0.1) / 8 = 0.2;  max |d| = 1
  k3 = mean(exp(d) - d - 1) = (0 + 0.106531 + 0.718282 + 0.004837) / 8 = 0.103706
  outside [1/2, 2] (|d| > ln 2 = 0.693147): the d = 1 token alone -> 1/8.
"""

from __future__ import annotations

import math

import pytest
from trainer_testlib import tiny_model

from posttrain.configs.trainer import MismatchConfig, TrainerConfig
from posttrain.trainer.batch import TrainBatch, TrainRow
from posttrain.trainer.trainer import Trainer

PROMPT = (3, 5, 7, 9)
COMPLETIONS = ((11, 12, 13, 14), (21, 22, 23, 24))
DELTA = (0.0, 0.5, -1.0, 0.1)
A = 0.5 / (0.5 + 1e-6)


def _rows(behaviour):
    return [
        TrainRow(PROMPT, comp, beh, reward, "g", (1, 1, 1, 1), rollout_id=f"r{i}")
        for i, (comp, beh, reward) in enumerate(zip(COMPLETIONS, behaviour, (1.0, 0.0)))
    ]


def _step(correction: str, perturbed: bool = True):
    trainer = Trainer(tiny_model(0), TrainerConfig(mismatch=MismatchConfig(correction=correction, bound=2.0)))
    own = trainer.token_logprobs(_rows([(0.0,) * 4] * 2))
    delta = DELTA if perturbed else (0.0,) * 4
    behaviour = [tuple(lp + d for lp, d in zip(own[0], delta)), own[1]]
    return trainer.step(TrainBatch(tuple(_rows(behaviour))))


def test_trainer_logprobs_are_the_engines_reference():
    """token_logprobs equals log_softmax(logits) of one unpadded forward per row (what an engine reports)."""
    from trainer_testlib import reference_logprobs

    model = tiny_model(0)
    trainer = Trainer(model, TrainerConfig())
    got = trainer.token_logprobs(_rows([(0.0,) * 4] * 2))
    for comp, lps in zip(COMPLETIONS, got):
        assert lps == pytest.approx(reference_logprobs(model, PROMPT, comp), abs=1e-5)


@pytest.mark.parametrize("correction", ["none", "tis", "mask"])
def test_mismatch_metric_by_hand(correction):
    stats = _step(correction)
    assert stats.mismatch_abs_mean == pytest.approx(0.2, abs=1e-5)
    assert stats.mismatch_abs_max == pytest.approx(1.0, abs=1e-5)
    assert stats.mismatch_k3 == pytest.approx((math.exp(-0.5) - 0.5 + math.e - 2 + math.exp(-0.1) - 0.9) / 8, abs=1e-5)
    assert stats.mismatch_k3 == pytest.approx(0.103706, abs=1e-5)
    assert stats.mismatch_outside == 1 / 8
    assert stats.mismatch_corrected == (0.0 if correction == "none" else 1 / 8)


def test_on_policy_rows_show_no_mismatch():
    stats = _step("tis", perturbed=False)
    assert stats.mismatch_abs_max < 1e-5 and stats.mismatch_outside == 0 and stats.mismatch_corrected == 0
    assert stats.loss == pytest.approx(0.0, abs=1e-5)  # ratio 1, weights 1: -a/2 + a/2


def test_corrections_change_the_loss_by_hand():
    """GRPO loss = sum_b -A_b mean_t(w_bt x term_bt) / 2 rows.
    none: PPO ratio exp(d) against behaviour, clipped to [0.8, 1.2] (row 0, A > 0: min(r, 1.2)):
      row 0 terms (1, 0.606531, 1.2, 0.904837), mean 0.927842; row 1 ratio 1
      -> loss = (-a 0.927842 + a) / 2 = a 0.036079.
    tis: ratio 1 against the trainer's own log-probs; row 0 weights min(exp(d), 2) =
      (1, 0.606531, 2, 0.904837), mean 1.127842 -> loss = -a (1.127842 - 1) / 2 = -a 0.063921.
    mask: ratio 1; row 0 weights (1, 1, 0, 1) (exp(1) > 2 is masked), mean 0.75
      -> loss = -a (0.75 - 1) / 2 = a 0.125."""
    assert _step("none").loss == pytest.approx(A * 0.036079, abs=1e-5)
    assert _step("tis").loss == pytest.approx(-A * 0.063921, abs=1e-5)
    assert _step("mask").loss == pytest.approx(A * 0.125, abs=1e-5)


def test_correction_is_off_by_default():
    assert TrainerConfig().mismatch.correction == "none"
    with pytest.raises(ValueError, match="bound"):
        MismatchConfig(bound=1.0)
