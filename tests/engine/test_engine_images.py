"""Every text engine reads text only: a prompt that carries an image (`Message.images`) is
refused with one clear error, never rendered without it (the field's silent failure: an image
dropped between the environment and the trainer while the loss looks normal)."""

from __future__ import annotations

import asyncio

import pytest

from posttrain.configs.pipeline import PipelineConfig
from posttrain.domains.registry import get
from posttrain.engine.base import chat_ids
from posttrain.engine.hf import HFEngine
from posttrain.errors import ConfigError
from posttrain.model.arch import random_model
from posttrain.pipeline import EmbeddedWorkers, Pipeline, Scheduler
from posttrain.serve.spec import encode_chat as spec_encode_chat
from posttrain.types import Completion, Message, SamplingParams


@pytest.fixture(scope="module")
def engine():
    model, tok = random_model("micro", 0)
    return HFEngine(model.eval(), tok, seed=1)


@pytest.fixture(scope="module")
def task():
    return get("chart").sample(0, "train", 1)


def test_every_chat_renderer_refuses_a_message_with_an_image(engine, task):
    img = task.images[0]
    for render in (
        lambda m: chat_ids(engine.tokenizer, m),
        engine.encode_chat,
        lambda m: spec_encode_chat(engine.tokenizer, m),
    ):
        with pytest.raises(ConfigError, match=rf"messages\[0\] carries 1 image.*sha256:{img.sha256}.*reads text only"):
            render(list(task.prompt))
    # the same text without its image is a prompt like any other
    assert engine.encode_chat([Message("user", task.prompt[0].content)])


def test_the_batched_encoding_refuses_the_image_prompt_alone(engine, task):
    text = [Message("user", "what is 2+2?")]
    got = engine.encode_chats([text, list(task.prompt), text])
    assert got[0] == got[2] == engine.encode_chat(text)
    assert isinstance(got[1], ConfigError) and "image" in str(got[1])


def pipeline_group(engine, task):
    """One group of two samples of a chart `task` through the staged training pipeline on `engine`."""
    cfg = PipelineConfig(execute_workers=1, backoff_s=0.0)
    sched = Scheduler(cfg, {"chart": 1.0}, {"chart": "short"})

    async def go():
        async with Pipeline(cfg, EmbeddedWorkers(engine), SamplingParams(n=2, max_tokens=4), sched, seed=0) as p:
            return await p.run_groups([task])

    (group,) = asyncio.run(go())
    return group


def test_an_image_task_through_the_training_pipeline_is_masked_with_the_error_not_trained_blind(engine, task):
    group = pipeline_group(engine, task)
    assert len(group.rollouts) == 2
    for r in group.rollouts:
        assert r.score is None and r.error_kind == "config", (r.error_kind, r.error)
        assert "reads text only" in r.error and not r.completion.token_ids


class _Zooms(HFEngine):
    """The micro text model's engine, whose first turn is the zoom (what a model would ask):
    the observation then comes back with an image this engine cannot read."""

    def generate(self, requests):
        out = []
        for req in requests:
            if req.prompt_ids.count(self.eos_token_id) == 0:  # no assistant turn yet
                ids = (*self.tokenizer.encode("ZOOM 0,0,40,40", add_special_tokens=False), self.eos_token_id)
                c = Completion(req.prompt_ids, ids, "ZOOM 0,0,40,40", (-1.0,) * len(ids), "stop", self.version)
                out.append([c] * req.params.n)
            else:
                out += super().generate([req])
        return out


def test_an_observation_image_given_a_text_engine_is_refused_and_the_episode_masked_with_why(engine):
    """chart_zoom's question without its chart (text only): the prompt passes, the zoom's image
    comes back in the observation, and the text engine's chat renderer refuses it: each episode is
    masked with kind config and the refusal, never continued without the image."""
    from dataclasses import replace

    task = get("chart_zoom").sample(0, "train", 1)
    text_task = replace(task, prompt=(Message("user", task.prompt[0].content),))
    zooms = _Zooms(engine.model, engine.tokenizer, seed=1)
    cfg = PipelineConfig(execute_workers=1, backoff_s=0.0)
    sched = Scheduler(cfg, {"chart_zoom": 1.0}, {"chart_zoom": "short"})

    async def go():
        async with Pipeline(cfg, EmbeddedWorkers(zooms), SamplingParams(n=2, max_tokens=4), sched, seed=0) as p:
            return await p.run_groups([text_task])

    (group,) = asyncio.run(go())
    for r in group.rollouts:
        assert r.score is None and r.error_kind == "config", (r.error_kind, r.error)
        assert r.error.startswith("the observation could not be encoded: ConfigError: messages[")
        assert "carries 1 image(s)" in r.error and "reads text only" in r.error
        assert len(r.turns) == 1 and r.turns[0].images
