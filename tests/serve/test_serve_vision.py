"""`posttrain serve` of the embedded vision-language model (model/vision.py; issue 40 item 4):
an `image_url` part reaches the model's pixels through the one path training generates by (the
hf engine's `encode_chat` and `GenerationRequest.images`), in both tiers and when streaming. The
reference is the hf engine over the same folder given the task's prompt and image directly.
The text-only model's refusal (400 `images_not_supported`) is tested in test_serve_images.py."""

from __future__ import annotations

import base64
import json

import httpx
import pytest
from serve_helpers import running

from posttrain.configs.serve import ServeConfig
from posttrain.domains.registry import get
from posttrain.engine.hf import HFEngine
from posttrain.serve.server import build_server
from posttrain.types import GenerationRequest, Message, SamplingParams

TOKENS = 6
GREEDY = SamplingParams(n=1, temperature=0.0, max_tokens=TOKENS)


@pytest.fixture(scope="module")
def served(tiny_vlm):
    engine = HFEngine.from_pretrained(tiny_vlm, device="cpu", seed=0)
    app = build_server(ServeConfig(model=str(tiny_vlm), canary={"probe_domains": []}))
    with running(app) as url:
        yield url, engine


def _task(index: int):
    return get("chart").sample(index, "train", 1)


def _body(prompt: Message, model: str = "posttrain", **extra) -> dict:
    parts = [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(i.png).decode()}}
        for i in prompt.images
    ]
    return {
        "model": model,
        "messages": [{"role": prompt.role, "content": [*parts, {"type": "text", "text": prompt.content}]}],
        "max_tokens": TOKENS,
        "temperature": 0,
        "logprobs": True,
        "return_token_ids": True,
        **extra,
    }


def _ask(url: str, body: dict) -> dict:
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _direct(engine: HFEngine, prompt: Message):
    """The hf engine's greedy completion of `prompt` and its images, given directly."""
    req = GenerationRequest(engine.encode_chat([prompt]), GREEDY, images=prompt.images)
    return engine.generate([req])[0][0]


def test_an_image_request_gets_the_hf_engines_tokens_for_that_prompt_and_image(served):
    url, engine = served
    prompt = _task(0).prompt[0]
    want = _direct(engine, prompt)
    for model, tier in (("posttrain", "standard"), ("posttrain:fast", "fast")):  # fast: the same engine
        out = _ask(url, _body(prompt, model))
        assert out["service_tier"] == tier
        choice = out["choices"][0]
        assert choice["prompt_token_ids"] == list(want.prompt_ids)
        assert choice["token_ids"] == list(want.token_ids) and len(want.token_ids) == TOKENS
        assert [t["logprob"] for t in choice["logprobs"]["content"]] == pytest.approx(list(want.logprobs), abs=1e-5)


def test_two_images_with_one_question_give_different_logprobs(served):
    url, _ = served
    first, second = _task(0).prompt[0], _task(1).prompt[0]
    swapped = Message(first.role, first.content, images=second.images)
    assert first.images != swapped.images
    a, b = (_ask(url, _body(m))["choices"][0] for m in (first, swapped))
    assert a["prompt_token_ids"] == b["prompt_token_ids"]  # one prompt: only the pixels differ
    lps = [[t["logprob"] for t in c["logprobs"]["content"]] for c in (a, b)]
    assert lps[0][0] != lps[1][0]


def test_the_streamed_answer_is_the_hf_engines_for_that_image(served):
    url, engine = served
    prompt = _task(2).prompt[0]
    want = _direct(engine, prompt)
    text = ""
    with httpx.stream("POST", url + "/v1/chat/completions", json=_body(prompt, stream=True), timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                assert "error" not in event, event
                text += event["choices"][0]["delta"].get("content") or ""
    assert text == want.text and want.text


def test_a_text_request_to_the_vision_model_is_answered_as_the_engine_answers_it(served):
    url, engine = served
    prompt = Message("user", "what is 2+3?")
    want = _direct(engine, prompt)
    body = _body(prompt)
    body["messages"][0]["content"] = prompt.content
    assert _ask(url, body)["choices"][0]["token_ids"] == list(want.token_ids)


def test_a_weight_update_reaches_both_tiers_of_the_vision_model(tiny_vlm, tmp_path, monkeypatch):
    """/v1/update_weights with another VLM folder: both tiers then answer an image request as the
    hf engine over that folder does."""
    import shutil

    import torch

    from posttrain.model.vision import load_vlm

    other = tmp_path / "other"
    model, _, _ = load_vlm(tiny_vlm)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(-1.5)
    model.save_pretrained(other)
    for f in tiny_vlm.iterdir():
        if not (other / f.name).exists():
            shutil.copy2(f, other / f.name)
    prompt = _task(0).prompt[0]
    before, want = (_direct(HFEngine.from_pretrained(d, device="cpu", seed=0), prompt) for d in (tiny_vlm, other))
    assert list(before.logprobs) != list(want.logprobs)
    monkeypatch.setenv("POSTTRAIN_ADMIN_TOKEN", "t0ken")
    with running(build_server(ServeConfig(model=str(tiny_vlm), canary={"probe_domains": []}))) as url:
        r = httpx.post(url + "/v1/update_weights", json={"path": str(other)}, headers={"Authorization": "Bearer t0ken"})
        assert r.status_code == 200 and r.json()["weights"] == 1, r.text
        for model_name in ("posttrain", "posttrain:fast"):
            choice = _ask(url, _body(prompt, model_name))["choices"][0]
            assert choice["token_ids"] == list(want.token_ids)
            got = [t["logprob"] for t in choice["logprobs"]["content"]]
            assert got == pytest.approx(list(want.logprobs), abs=1e-5)
        assert httpx.get(url + "/health").status_code == 200 and httpx.get(url + "/metrics").status_code == 200
