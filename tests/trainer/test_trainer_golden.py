"""Refactor safety: under a fixed seed, three steps give the recorded losses.

Recorded with torch 2.13.0 (CPU), transformers 5.23.0, on 1 and on 2 threads
(identical). A refactor of the trainer or the losses must keep these values;
a deliberate numerical change must re-record them and say why. They run under
`normalise: kept` (the normalisation they were recorded with); the default
`sampled` scales each step by the informative share, checked exactly against
these in test_trainer_step.py (test_sampled_normalisation_scales_...).
"""

from __future__ import annotations

import pytest
from trainer_testlib import synthetic_batch, tiny_model

from posttrain.configs.trainer import DAPOLossConfig, DrGRPOLossConfig, GRPOLossConfig, TrainerConfig
from posttrain.trainer.trainer import Trainer

GOLDEN = {
    "grpo": (GRPOLossConfig(), [-0.005062146, -0.015667289, 0.038311283], [1.8609749, 1.4740700, 2.2158875]),
    "dr_grpo": (
        DrGRPOLossConfig(max_completion_tokens=6),
        [0.017172837, 0.016298844, -0.027690231],
        [0.3123920, 0.3874821, 0.3142459],
    ),
    "dapo": (DAPOLossConfig(), [0.070504662, 0.080106683, -0.095892636], [1.2825541, 1.4670465, 1.0886155]),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_three_steps_match_the_recorded_losses(name):
    loss_config, losses, grad_norms = GOLDEN[name]
    trainer = Trainer(tiny_model(0), TrainerConfig(loss=loss_config, micro_batch_size=4, normalise="kept"))
    stats = [trainer.step(synthetic_batch(seed=10 + i)) for i in range(3)]
    assert [s.outcome for s in stats] == ["applied"] * 3
    assert [s.loss for s in stats] == pytest.approx(losses, abs=1e-6)
    assert [s.grad_norm for s in stats] == pytest.approx(grad_norms, abs=1e-5)
