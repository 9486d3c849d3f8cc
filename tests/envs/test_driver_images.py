"""Observations that carry images through the episode driver (envs/driver.py, envs/base.py): an
environment's `StepResult.images` ride on the observation's tool message, every later request
carries every image of its context, a Turn keeps their digests (and the trace shows them by
digest), an observation whose images no generation saw is left out of the completion, and a
text-only encoder refuses an observation image clearly. Engine-free: a character encoder that
writes an image as a run of 4 image tokens (the real vision model: tests/trainer/
test_trainer_pixels_multiturn.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from posttrain.domains.registry import get
from posttrain.engine.base import chat_ids
from posttrain.envs import driver
from posttrain.errors import ConfigError
from posttrain.trace import transcript
from posttrain.types import Completion, Message, SamplingParams, Task

IMAGE = 7
RUN = 4


def encode(messages: Sequence[Message]) -> tuple[int, ...]:
    out: list[int] = []
    for m in messages:
        out += [1, *(ord(c) + 10 for c in m.role), 2, *[IMAGE] * (RUN * len(m.images))]
        out += [ord(c) + 10 for c in m.content]
        out += [3] if m.role == "assistant" else []
    return (*out, 1, *(ord(c) + 10 for c in "assistant"), 2)


def _start(task: Task) -> driver.Trajectory:
    [(env, obs)] = driver.open_envs(get("chart_zoom"), task, 1)
    [t] = driver.start([(env, obs)], task, [encode(driver.first_messages(task, obs))], 3)
    return t


def _act(t: driver.Trajectory, text: str, digest: str) -> None:
    ids = tuple(ord(c) + 10 for c in text) + (3,)
    t.add_action(Completion(t.context(), ids, text, (-0.5,) * len(ids), "stop", pixel_digest=digest))


def test_an_observation_image_joins_the_context_and_every_later_request():
    task = get("chart_zoom").sample(0, "train", 1)
    t = _start(task)
    [req], _ = driver.requests([t], SamplingParams(n=1), 0, "g")
    assert req.images == task.images
    _act(t, get("chart_zoom").gold_zoom(task), "d1")
    driver.step(t)
    driver.observe(t, encode)
    assert not t.done and len(t.images) == 2 and t.messages[-1].role == "tool" and t.messages[-1].images
    assert t.turns[0].images == (t.images[1].sha256,)
    assert t.context().count(IMAGE) == RUN * 2  # the second image's run is in the context, mask 0
    [req], _ = driver.requests([t], SamplingParams(n=1), 0, "g")
    assert req.images == t.images and req.prompt_ids.count(IMAGE) == RUN * len(req.images)
    _act(t, f"Answer: {task.reference['answer']}", "d2")
    driver.step(t)
    assert t.done
    c = t.completion()
    assert c.pixel_digest == "d2" and t.seen_images == t.images and len(t.loss_mask) == len(c.token_ids)
    assert transcript(t.turns)[0]["images"] == [t.images[1].sha256] and "images" not in transcript(t.turns)[1]
    assert get("chart_zoom").score(task, driver.episode(t)).value == 1.0


def test_an_observation_image_no_generation_saw_is_left_out_of_the_completion():
    task = get("chart_zoom").sample(1, "train", 1)
    t = _start(task)
    _act(t, "ZOOM 0,0,40,40", "d1")
    end = len(t.ids)
    driver.step(t)
    driver.observe(t, encode)
    assert len(t.ids) > end and len(t.images) == 2
    driver.out_of_context(t)  # the next turn's context did not fit: no generation saw image 2
    c = t.completion()
    assert len(c.token_ids) == end == len(t.loss_mask) and c.pixel_digest == "d1"
    assert t.seen_images == task.images and IMAGE not in c.token_ids


def test_a_text_only_encoder_refuses_an_observation_image_and_the_episode_is_masked():
    from posttrain.model.tokenizer import build_tokenizer

    tok = build_tokenizer()
    task = get("chart_zoom").sample(0, "train", 1)
    text = Message("user", task.prompt[0].content)
    image = task.images[0]
    with pytest.raises(ConfigError, match=r"messages\[2\] carries 1 image\(s\).*reads text only"):
        chat_ids(tok, [text, Message("assistant", "ZOOM 0,0,9,9"), Message("tool", "zoom", (image,))])
    t = _start(dataclasses.replace(task, prompt=(text,)))  # the chart kept only in the reference
    _act(t, "ZOOM 0,0,40,40", "")
    driver.step(t)
    assert t.turns[0].images  # the zoom's image came back ...
    driver.observe(t, lambda ms: chat_ids(tok, ms))  # ... and the text encoder refuses it
    assert t.done and t.error == "config"


def test_the_pipeline_rollout_and_its_train_row_carry_the_observation_image():
    import asyncio
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "pipeline"))
    from pipeline_testlib import ScriptedEngine

    from posttrain.configs.pipeline import PipelineConfig
    from posttrain.pipeline import EmbeddedWorkers, Pipeline, Scheduler
    from posttrain.trainer.batch import rows_of

    d = get("chart_zoom")
    task = d.sample(2, "train", 1)
    zoom, answer = d.gold_turns(task)
    engine = ScriptedEngine(lambda context, j: answer if "<|tool|>" in context else zoom)
    cfg = PipelineConfig(backoff_s=0.0)
    sched = Scheduler(cfg, {d.name: 1.0}, {d.name: d.cost_class})

    async def go():
        async with Pipeline(cfg, EmbeddedWorkers(engine), SamplingParams(n=2, max_tokens=64), sched, seed=0) as p:
            return await p.run_groups([task])

    [group] = asyncio.run(go())
    for r in group.rollouts:
        assert r.reward == 1.0 and len(r.observation_images) == 1, (r.error, r.score)
        assert r.images == (*task.images, *r.observation_images)
        assert r.turns[0].images == (r.observation_images[0].sha256,)
    rows = rows_of(group.rollouts, 1.0)
    assert [len(row.images) for row in rows] == [2, 2]
