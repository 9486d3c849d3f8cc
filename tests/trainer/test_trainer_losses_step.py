"""Trainer.step with each loss added for issue 28: micro-batches sum to the full-batch gradient
with the KL term and a mismatch correction on, and each loss's per-row figures reach
StepStats.rollouts."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from trainer_testlib import synthetic_batch, tiny_model

from posttrain.configs.trainer import TrainerConfig
from posttrain.trainer.batch import TrainBatch
from posttrain.trainer.trainer import Trainer

NEW = ["rloo", "reinforce_pp", "gspo", "cispo"]


@pytest.mark.parametrize("loss", NEW)
@pytest.mark.parametrize("correction", ["none", "tis"])
def test_micro_batching_is_exact_with_kl_and_correction(loss, correction):
    batch = synthetic_batch(seed=4)  # off-policy behaviour log-probs: ratios away from 1 without a correction

    def config(rows: int) -> TrainerConfig:
        return TrainerConfig(
            loss={"type": loss}, micro_batch_size=rows, grad_clip=1e9, kl_coef=0.1, mismatch={"correction": correction}
        )

    def run(rows: int):
        model = tiny_model(0)
        trainer = Trainer(model, config(rows), ref_model=tiny_model(1))  # a reference that differs: k3 > 0
        captured = []
        trainer.optimizer.step = lambda: captured.extend(p.grad.clone() for p in trainer.params)  # type: ignore[method-assign]
        return trainer.step(batch), captured

    full_stats, full = run(64)
    split_stats, split = run(3)
    assert full_stats.kl > 0.0 and full_stats.loss == pytest.approx(split_stats.loss, rel=1e-5, abs=1e-7)
    assert any(g.abs().max() > 0 for g in full), "no gradient: the comparison would be vacuous"
    for a, b in zip(full, split):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_gspo_reports_its_sequence_ratio_per_rollout():
    model = tiny_model(0)
    batch = synthetic_batch(seed=4)  # behaviour ~ -4: the sequence ratios leave GSPO's narrow band
    rows = tuple(replace(r, rollout_id=f"r{i}") for i, r in enumerate(batch.rows))
    stats = Trainer(model, TrainerConfig(loss={"type": "gspo"})).step(TrainBatch(rows))
    links = [link for link in stats.rollouts.values() if link.ratio is not None]
    assert links and all(link.clipped in (0.0, 1.0) for link in links)
    assert any(link.clipped == 1.0 for link in links)  # far off-policy: some sequence is clipped
