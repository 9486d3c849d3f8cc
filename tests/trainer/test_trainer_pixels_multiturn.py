"""The pixel path over a multi-turn episode whose tool returns a new image (chart_zoom): played
through the episode driver with the hf engine on the embedded vision model, the context of the
second turn holds two images, the engine generates from both, and the trainer's recompute of the
whole episode agrees with the generator's log-probs (the tolerance of test_trainer_pixels.py);
the observation's image dropped or one of its pixels changed, between the episode and the batch
or between the driver and the engine, fails loudly.

The first turn's action is scripted (the gold zoom: a 2-step model does not zoom by itself); its
behaviour log-probs are the trainer's on the one-image context. The second turn is sampled by
the engine from the two-image context, the part this test checks."""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch
from trainer_testlib import one_pixel_changed

from posttrain.configs.trainer import TrainerConfig
from posttrain.domains.registry import get
from posttrain.engine.hf import HFEngine
from posttrain.envs import driver
from posttrain.errors import ConfigError, TrainerError
from posttrain.model import vision
from posttrain.trainer.batch import TrainBatch, TrainRow
from posttrain.trainer.trainer import Trainer
from posttrain.types import Completion, SamplingParams


@pytest.fixture(scope="module")
def parts(tiny_vlm):
    model, tok, proc = vision.load_vlm(tiny_vlm)
    return HFEngine(model, tok, processor=proc, seed=0), Trainer(model, TrainerConfig(), processor=proc), tok


def _scripted(trainer: Trainer, engine: HFEngine, tok, t: driver.Trajectory, text: str) -> Completion:
    """`text` as the next action, with the trainer's log-probs of it on the context so far."""
    ids = (*tok.encode(text, add_special_tokens=False), engine.eos_token_id)
    row = TrainRow(t.context(), ids, (0.0,) * len(ids), 0.0, "s", (1,) * len(ids), images=t.images)
    [logprobs] = trainer.token_logprobs([row])
    digest = vision.pixel_digest(vision.pixel_values(engine.processor, t.images))
    return Completion(t.context(), ids, text, tuple(logprobs), "stop", pixel_digest=digest)


def _episode(parts, seed: int) -> tuple[driver.Trajectory, object]:
    engine, trainer, tok = parts
    d = get("chart_zoom")
    task = d.sample(0, "train", 1)
    [(env, obs)] = driver.open_envs(d, task, 1)
    [t] = driver.start([(env, obs)], task, [engine.encode_chat(driver.first_messages(task, obs))], max_turns=2)
    t.add_action(_scripted(trainer, engine, tok, t, d.gold_zoom(task)))
    driver.step(t)
    driver.observe(t, engine.encode_chat)
    assert not t.done and len(t.images) == 2 and t.images[0] == task.images[0]
    [req], targets = driver.requests([t], SamplingParams(max_tokens=8, temperature=1.0), seed, "g")
    assert req.images == t.images
    driver.add_actions(targets, engine.generate([req]))
    driver.step(t)
    driver.close_envs([t.env])
    return t, req


def _row(t: driver.Trajectory, reward: float) -> TrainRow:
    return TrainRow.from_completion(t.completion(), reward, "g", 1.0, t.loss_mask, images=t.seen_images)


@pytest.fixture(scope="module")
def episodes(parts):
    return [_episode(parts, seed) for seed in (1, 2)]


def test_the_second_turn_sees_both_images_and_the_trainer_agrees_with_the_generator(parts, episodes):
    engine, trainer, _ = parts
    (t, req), (t2, _) = episodes
    image_id, run = engine.model.config.image_token_index, engine.model.config.image_seq_length
    row = _row(t, 1.0)
    assert len(row.images) == 2 and row.pixel_digest
    assert (*row.prompt_ids, *row.completion_ids).count(image_id) == 2 * run
    assert req.prompt_ids.count(image_id) == 2 * run
    assert row.pixel_digest == vision.pixel_digest(vision.pixel_values(engine.processor, row.images))
    behaviour = [lp for lp, m in zip(row.behaviour_logprobs, row.loss_mask) if m]
    [got] = trainer.token_logprobs([row])
    assert len(got) == len(behaviour) and torch.allclose(torch.tensor(got), torch.tensor(behaviour), atol=1e-5)
    before = [p.detach().clone() for p in trainer.params]
    stats = trainer.step(TrainBatch((row, _row(t2, 0.0))))
    assert stats.outcome == "applied" and stats.mismatch_abs_max <= 1e-3
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.params))
    engine.update_weights()


def test_the_observation_image_dropped_or_altered_in_the_row_fails_loudly(parts, episodes):
    _, trainer, _ = parts
    row = _row(episodes[0][0], 1.0)
    run = trainer.model.config.image_seq_length
    with pytest.raises(TrainerError, match=rf"rows\[0\] has {2 * run} image tokens for 1 image\(s\).*image was lost"):
        trainer.token_logprobs([dataclasses.replace(row, images=row.images[:1])])
    altered = dataclasses.replace(row, images=(row.images[0], one_pixel_changed(row.images[1])))
    with pytest.raises(TrainerError, match=r"rows\[1\]: the pixels of its images differ .*an image was altered"):
        trainer.step(TrainBatch((_row(episodes[1][0], 0.0), altered)))


def test_the_observation_image_dropped_from_the_request_is_refused_by_the_engine(parts, episodes):
    engine, _, _ = parts
    req = episodes[0][1]
    run = engine.model.config.image_seq_length
    with pytest.raises(ConfigError, match=rf"has {2 * run} image tokens for 1 image\(s\)"):
        engine.generate([dataclasses.replace(req, images=req.images[:1])])


def test_the_processor_renders_the_two_image_conversation_as_the_engine_does(parts, episodes, tiny_vlm):
    """Plain transformers' processor over the episode's messages (the prompt's chart, the zoom, the
    tool message with its image) gives the ids the driver's second request held and its pixels."""
    from PIL import Image as PILImage
    from transformers import AutoProcessor

    engine, _, _ = parts
    t, req = episodes[0]
    proc = AutoProcessor.from_pretrained(tiny_vlm, local_files_only=True)
    upto = t.messages[:-1]  # up to the observation with the zoom: the second turn's prompt
    text = proc.apply_chat_template(vision.chat(upto), add_generation_prompt=True, tokenize=False)
    pics = [PILImage.open(io.BytesIO(i.png)).convert("RGB") for m in upto for i in m.images]
    enc = proc(text=text, images=pics, return_tensors="pt")
    assert len(pics) == 2 and tuple(enc["input_ids"][0].tolist()) == engine.encode_chat(upto) == req.prompt_ids
    assert torch.equal(enc["pixel_values"], vision.pixel_values(engine.processor, t.images))
