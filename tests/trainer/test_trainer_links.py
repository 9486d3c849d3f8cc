"""The trainer reports what it did with each rollout by rollout id: advantages computed once
(scored empty completions counted in their group), the same links whatever the row order."""

from __future__ import annotations

import random

import pytest
import torch
from trainer_testlib import reference_logprobs, tiny_model

from posttrain.configs.trainer import TrainerConfig
from posttrain.errors import TrainerError
from posttrain.trainer.batch import TrainBatch, TrainRow
from posttrain.trainer.trainer import Trainer


def _rows(model):
    out = []
    for g, rewards in enumerate(([1.0, 0.0, 0.0, None], [0.0, 1.0, 1.0, 0.0], [1.0, 1.0, None, None])):
        for i, reward in enumerate(rewards):
            prompt = (3 + g, 4 + i, 5)
            completion = () if reward is None else tuple(7 + (g + i + k) % 20 for k in range(2 + i))
            out.append(
                TrainRow(
                    prompt,
                    completion,
                    reference_logprobs(model, prompt, completion) if completion else (),
                    0.25 if reward is None else reward,
                    f"g{g}",
                    (1,) * len(completion),
                    rollout_id=f"r{g}.{i}",
                )
            )
    return out  # rows with reward 0.25 and no tokens: scored empty completions


def _spy_loss_advantages(trainer):
    """Rollout id -> the advantage the loss was given for it (rows that entered the loss)."""
    seen, step = {}, trainer._micro_step

    def spy(rows, advantage_b, totals, weight=1.0):
        if weight:
            seen.update(zip((r.rollout_id for r in rows), advantage_b.tolist()))
        return step(rows, advantage_b, totals, weight)

    trainer._micro_step = spy
    return seen


def test_advantages_are_computed_once_and_count_scored_empty_completions():
    model = tiny_model()
    trainer = Trainer(model, TrainerConfig(lr=1e-3, micro_batch_size=2))
    seen = _spy_loss_advantages(trainer)
    rows = _rows(model)
    stats = trainer.step(TrainBatch(tuple(rows)))
    links = stats.rollouts
    assert set(links) == {r.rollout_id for r in rows}
    # the loss used exactly the advantages reported for the rows it saw
    assert seen and all(links[rid].advantage == adv for rid, adv in seen.items())
    # a scored empty completion counts in its group's baseline; it enters no loss
    rewards = torch.tensor([r.reward for r in rows], dtype=torch.float64)
    groups = torch.tensor([int(r.group_id[1:]) for r in rows])
    want = trainer.loss.advantages(rewards, groups).to(torch.float32).tolist()
    assert [links[r.rollout_id].advantage for r in rows] == want
    empty = [r.rollout_id for r in rows if not r.completion_ids]
    assert empty and all(links[rid].ratio is None and links[rid].clipped is None for rid in empty)
    assert all(rid not in seen for rid in empty)
    # with the empty completion in group g0 (rewards 1, 0, 0, 0.25) its baseline is not the mean of 1 and 0
    g0 = [links[f"r0.{i}"].advantage for i in range(2)]
    assert g0[0] + g0[1] != pytest.approx(0.0, abs=1e-3)


def test_a_reordered_batch_gives_the_same_links_and_weights():
    results = []
    for order in ("as is", "shuffled"):
        model = tiny_model()
        trainer = Trainer(model, TrainerConfig(lr=1e-3, micro_batch_size=2))
        rows = _rows(model)
        if order == "shuffled":
            random.Random(7).shuffle(rows)
        links = trainer.step(TrainBatch(tuple(rows))).rollouts
        results.append((links, [p.detach().clone() for p in model.parameters()]))
    (a, pa), (b, pb) = results
    assert a.keys() == b.keys()
    for rid in a:
        assert b[rid].advantage == pytest.approx(a[rid].advantage, abs=1e-6), rid
        assert (a[rid].ratio is None) == (b[rid].ratio is None), rid
        if a[rid].ratio is not None:
            assert b[rid].ratio == pytest.approx(a[rid].ratio, abs=1e-5) and b[rid].clipped == a[rid].clipped, rid
    assert all(torch.allclose(x, y, atol=1e-6, rtol=0) for x, y in zip(pa, pb))


def test_a_rollout_id_twice_in_a_batch_is_refused():
    row = TrainRow((3, 4), (5,), (-1.0,), 1.0, "g", (1,), rollout_id="same")
    with pytest.raises(TrainerError, match="rollout_id twice"):
        TrainBatch((row, TrainRow((3, 4), (6,), (-1.0,), 0.0, "g", (1,), rollout_id="same")))
