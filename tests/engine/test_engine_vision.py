"""The hf engine over the embedded vision-language model (model/vision.py): it generates from a
request's images with the pixels its processor gives, its greedy output and log-probs are plain
transformers' for the same image, each request of a batch sees its own image, and a request whose
image tokens and images disagree (an image dropped) is refused."""

from __future__ import annotations

import pytest
import torch

from posttrain.domains.registry import get
from posttrain.engine.hf import HFEngine, HFEngineConfig
from posttrain.errors import ConfigError
from posttrain.model import vision
from posttrain.model.arch import random_model
from posttrain.types import GenerationRequest, SamplingParams

GREEDY = SamplingParams(n=1, temperature=0.0, max_tokens=8)


@pytest.fixture(scope="module")
def engine(tiny_vlm):
    return HFEngine.from_pretrained(tiny_vlm, device="cpu", seed=0)


def _request(engine, task, params=GREEDY):
    images = tuple(i for m in task.prompt for i in m.images)
    return GenerationRequest(engine.encode_chat(task.prompt), params, images=images)


def _plain(engine, req):
    """Greedy tokens and their log-probs by plain transformers: `generate`, then one forward."""
    ids = torch.tensor([req.prompt_ids])
    pixels = vision.pixel_values(engine.processor, req.images)
    out = engine.model.generate(
        input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=pixels, do_sample=False, max_new_tokens=8
    )
    tokens = out[0, ids.shape[1] :].tolist()
    logits = engine.model(input_ids=out, pixel_values=pixels).logits[0, ids.shape[1] - 1 : -1].float()
    logps = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
    return tokens, logps


def test_greedy_output_and_logprobs_equal_plain_transformers(engine):
    req = _request(engine, get("chart").sample(0, "train", 1))
    got = engine.generate([req])[0][0]
    tokens, logps = _plain(engine, req)
    assert list(got.token_ids) == tokens and len(tokens) > 0
    assert torch.allclose(torch.tensor(got.logprobs), logps, atol=1e-5)
    assert got.pixel_digest == vision.pixel_digest(vision.pixel_values(engine.processor, req.images))


def test_each_request_of_a_batch_sees_its_own_image(engine):
    reqs = [_request(engine, get(name).sample(3, "train", 2)) for name in ("chart", "ui", "drawing")]
    together = engine.generate(
        reqs
        + [_request(engine, get("chart").sample(0, "train", 1), SamplingParams(n=3, temperature=0.0, max_tokens=8))]
    )
    for req, outs in zip(reqs, together):
        alone = engine.generate([req])[0][0]
        assert outs[0].token_ids == alone.token_ids
        assert torch.allclose(torch.tensor(outs[0].logprobs), torch.tensor(alone.logprobs), atol=1e-5)
    assert len({c.pixel_digest for outs in together for c in outs}) == 4


def test_the_image_reaches_the_model(engine):
    a, b = get("chart").sample(0, "train", 1), get("chart").sample(1, "train", 1)
    req = _request(engine, a)
    swapped = GenerationRequest(req.prompt_ids, req.params, images=_request(engine, b).images)
    one, two = engine.generate([req, swapped])
    assert one[0].pixel_digest != two[0].pixel_digest
    n = min(len(one[0].logprobs), len(two[0].logprobs))
    assert one[0].logprobs[:n] != two[0].logprobs[:n]


def test_a_request_missing_its_image_is_refused(engine):
    req = _request(engine, get("ui").sample(0, "train", 1))
    with pytest.raises(ConfigError, match=r"requests\[0\] has 64 image tokens for 0 image\(s\)"):
        engine.generate([GenerationRequest(req.prompt_ids, req.params)])
    two = GenerationRequest(req.prompt_ids, req.params, images=req.images * 2)
    with pytest.raises(ConfigError, match=r"64 image tokens for 2 image\(s\) of 64 tokens each"):
        engine.generate([two])


def test_a_text_model_still_refuses_images():
    model, tok = random_model("micro", 0)
    text = HFEngine(model.eval(), tok, seed=1)
    task = get("chart").sample(0, "train", 1)
    ids = text.encode_chat([type(task.prompt[0])("user", "hi")])
    with pytest.raises(ConfigError, match=r"requests\[0\] carries 1 image.*reads text only"):
        text.generate([GenerationRequest(ids, GREEDY, images=task.prompt[0].images)])


def test_an_image_task_through_the_training_pipeline_reaches_the_trainer_rows_with_its_pixels(engine):
    from test_engine_images import pipeline_group

    from posttrain.trainer.batch import rows_of

    task = get("chart").sample(0, "train", 1)
    group = pipeline_group(engine, task)
    want = vision.pixel_digest(vision.pixel_values(engine.processor, task.prompt[0].images))
    assert [r.error_kind for r in group.rollouts] == [None, None]
    assert all(r.score is not None and r.completion.pixel_digest == want for r in group.rollouts)
    for row in rows_of(group.rollouts, 1.0):
        assert row.images == task.prompt[0].images and row.pixel_digest == want


def test_engines_that_read_text_only_refuse_a_request_with_images():
    from posttrain.engine.base import check_request

    task = get("drawing").sample(0, "train", 1)
    req = GenerationRequest((1, 2), GREEDY, images=task.prompt[0].images)
    with pytest.raises(ConfigError, match=r"requests\[3\] carries 1 image\(s\) .*reads text only"):
        check_request(3, req, 100, None, "the limit")  # what the vllm engine calls
    check_request(3, req, 100, None, "the limit", images=True)


def test_a_chunked_prefill_keeps_an_images_tokens_in_the_forward_that_gets_its_pixels(engine):
    """Prompts (64 image tokens and a question each, of two lengths: padded, so the fused
    attention's one-forward path does not apply) longer than the chunk: chunking them would hand
    the model pixels with a part of their image tokens, or none."""
    reqs = [_request(engine, get(name).sample(0, "train", 1)) for name in ("chart", "ui")]
    assert len({len(r.prompt_ids) for r in reqs}) == 2 and min(len(r.prompt_ids) for r in reqs) > 16
    want = [(c[0].token_ids, c[0].logprobs) for c in engine.generate(reqs)]
    chunked = HFEngine(
        engine.model,
        engine.tokenizer,
        config=HFEngineConfig(prefill_chunk_tokens=16),
        processor=engine.processor,
        seed=0,
    )
    got = [(c[0].token_ids, c[0].logprobs) for c in chunked.generate(reqs)]
    for (ids, lps), (want_ids, want_lps) in zip(got, want, strict=True):
        assert ids == want_ids and lps == want_lps  # one forward either way: the same numbers
