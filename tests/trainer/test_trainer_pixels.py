"""The pixel path checked (issue 40 item 3): a vision model's trainer recomputes log-probs on the
exact pixels the generator saw, the train-inference mismatch of a step over image rows is the
engine's rounding (the step's mismatch figure), and an image dropped or altered between the
rollout and the batch fails the step loudly, before any update."""

from __future__ import annotations

import pytest
import torch
from trainer_testlib import one_pixel_changed

from posttrain.configs.trainer import TrainerConfig
from posttrain.domains.registry import get
from posttrain.engine.hf import HFEngine
from posttrain.errors import TrainerError
from posttrain.model import vision
from posttrain.model.arch import random_model
from posttrain.trainer.batch import TrainBatch, TrainRow
from posttrain.trainer.trainer import Trainer
from posttrain.types import GenerationRequest, SamplingParams


@pytest.fixture(scope="module")
def parts(tiny_vlm):
    model, tok, proc = vision.load_vlm(tiny_vlm)
    engine = HFEngine(model, tok, processor=proc, seed=0)
    return engine, Trainer(model, TrainerConfig(), processor=proc)


def _rows(engine, task, n=4):
    images = tuple(i for m in task.prompt for i in m.images)
    req = GenerationRequest(engine.encode_chat(task.prompt), SamplingParams(n=n, max_tokens=6, seed=3), images=images)
    return [
        TrainRow.from_completion(c, float(k % 2), task.id, 1.0, images=images)
        for k, c in enumerate(engine.generate([req])[0])
    ]


def test_the_trainer_scores_the_pixels_the_generator_saw(parts):
    engine, trainer = parts
    rows = _rows(engine, get("chart").sample(0, "train", 1))
    assert all(r.pixel_digest for r in rows)
    for row, got in zip(rows, trainer.token_logprobs(rows)):
        assert torch.allclose(torch.tensor(got), torch.tensor(row.behaviour_logprobs), atol=1e-5)
    before = [p.detach().clone() for p in trainer.params]
    stats = trainer.step(TrainBatch(tuple(rows)))
    assert stats.outcome == "applied" and stats.mismatch_abs_max <= 1e-3  # fp32: the rounding of two forwards
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.params))
    engine.update_weights()


def test_a_dropped_image_fails_the_step_before_any_update(parts):
    engine, trainer = parts
    rows = _rows(engine, get("ui").sample(0, "train", 1))
    dropped = TrainRow(
        *[getattr(rows[1], f) for f in ("prompt_ids", "completion_ids", "behaviour_logprobs")],
        rows[1].reward,
        rows[1].group_id,
        rows[1].loss_mask,
    )
    before = [p.detach().clone() for p in trainer.params]
    with pytest.raises(TrainerError, match=r"rows\[1\] has 64 image tokens for 0 image\(s\).*image was lost"):
        trainer.step(TrainBatch((rows[0], dropped, *rows[2:])))
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.params))


def test_one_changed_pixel_fails_the_step(parts):
    engine, trainer = parts
    rows = _rows(engine, get("drawing").sample(0, "train", 1))
    altered = one_pixel_changed(rows[0].images[0])
    assert not torch.equal(
        vision.pixel_values(engine.processor, (altered,)), vision.pixel_values(engine.processor, rows[0].images)
    )
    from dataclasses import replace

    bad = replace(rows[2], images=(altered,))
    with pytest.raises(TrainerError, match=r"rows\[2\]: the pixels of its images differ .*an image was altered"):
        trainer.step(TrainBatch((*rows[:2], bad, rows[3])))
    with pytest.raises(TrainerError, match=r"rows\[0\]: the pixels .* altered"):
        trainer.token_logprobs([bad])


def test_a_text_trainer_refuses_rows_with_images():
    model, _ = random_model("micro", 0)
    trainer = Trainer(model, TrainerConfig())
    image = get("chart").sample(0, "train", 1).prompt[0].images[0]
    row = TrainRow((1, 2), (3,), (-1.0,), 1.0, "g", (1,), images=(image,))
    with pytest.raises(TrainerError, match=r"rows\[0\] carries 1 image\(s\) but the model reads text only"):
        trainer.step(TrainBatch((row, TrainRow((1, 2), (4,), (-1.0,), 0.0, "g", (1,)))))


def test_a_replayed_image_row_keeps_its_image_through_the_checkpoint_json():
    import json

    from posttrain.trainer.replay import ReplayEntry

    image = get("ui").sample(0, "train", 1).prompt[0].images[0]
    row = TrainRow((1, 2), (3,), (-1.0,), 1.0, "g", (1,), images=(image,), pixel_digest="ab")
    entry = ReplayEntry("g", "ui", "ui:train:1:0", 1, (row, TrainRow((1, 2), (4,), (-1.0,), 0.0, "g", (1,))), 0, 2)
    again = ReplayEntry.from_json(json.loads(json.dumps(entry.to_json())))
    assert again == entry and again.rows[0].images[0].sha256 == image.sha256
