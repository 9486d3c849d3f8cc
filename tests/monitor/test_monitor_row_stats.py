"""The trainer's per-rollout ratio and clip share (by rollout id), as the trace and the monitor read them."""

from __future__ import annotations

import pytest


def test_row_stats_match_the_step_and_the_clip_rule(micro_base):
    import torch

    from posttrain.configs.trainer import TrainerConfig
    from posttrain.model.arch import load_model
    from posttrain.trainer.batch import TrainBatch, TrainRow
    from posttrain.trainer.trainer import Trainer

    model = load_model(micro_base)[0]
    trainer = Trainer(model, TrainerConfig(lr=1e-4))
    # behaviour log-probs of -30 make every ratio exp(logp + 30) >> 1 + clip_high: a row with a
    # positive advantage has all its tokens clipped, one with a negative advantage none
    # (the low clip needs ratio < 1 - clip_low). Group "a": rewards 1, 0 -> advantages +1, -1.
    rows = [
        TrainRow((5, 6, 7), (8, 9), (-30.0, -30.0), 1.0, "a", (1, 1), rollout_id="r0"),
        TrainRow((5, 6, 7), (10, 11, 12), (-30.0, -30.0, -30.0), 0.0, "a", (1, 1, 1), rollout_id="r1"),
        TrainRow((5, 6), (8,), (-30.0,), 1.0, "b", (1,), rollout_id="r2"),  # a group without signal: no loss
        TrainRow((5, 6), (9,), (-30.0,), 1.0, "b", (1,), rollout_id="r3"),
    ]
    stats = trainer.step(TrainBatch(tuple(rows)))
    links = stats.rollouts
    assert set(links) == {"r0", "r1", "r2", "r3"}
    assert [links[r].advantage for r in ("r0", "r1", "r2", "r3")] == pytest.approx([1.0, -1.0, 0.0, 0.0], abs=1e-4)
    assert all(links[r].ratio is None and links[r].clipped is None for r in ("r2", "r3"))
    (r0, c0), (r1, c1) = (links["r0"].ratio, links["r0"].clipped), (links["r1"].ratio, links["r1"].clipped)
    assert c0 == 1.0 and c1 == 0.0 and r0 > 1e6 and r1 > 1e6
    # the step's clip fraction is the token-weighted mean of the rows': (2 x 1 + 3 x 0) / 5
    assert stats.clip_frac == pytest.approx(2 / 5)
    # on-policy rows (behaviour = the model's own log-probs): ratio 1, nothing clipped
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[5, 6, 7, 8, 9]])).logits.float().log_softmax(-1)
    own = (float(logits[0, 2, 8]), float(logits[0, 3, 9]))
    on_policy = [TrainRow((5, 6, 7), (8, 9), own, 1.0, "c", (1, 1)), TrainRow((5, 6, 7), (8, 9), own, 0.0, "c", (1, 1))]
    trainer.step(TrainBatch(tuple(on_policy)))  # the previous step changed the weights: recompute
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[5, 6, 7, 8, 9]])).logits.float().log_softmax(-1)
    own = (float(logits[0, 2, 8]), float(logits[0, 3, 9]))
    on_policy = [
        TrainRow((5, 6, 7), (8, 9), own, 1.0, "c", (1, 1), rollout_id="p"),
        TrainRow((5, 6, 7), (8, 9), own, 0.0, "c", (1, 1), rollout_id="q"),
    ]
    links = trainer.step(TrainBatch(tuple(on_policy))).rollouts
    assert [(links[r].ratio, links[r].clipped) for r in ("p", "q")] == [pytest.approx((1.0, 0.0), abs=1e-5)] * 2
