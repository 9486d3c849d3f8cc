"""Chunked prefill (issue 39 item 3, `engine.prefill_chunk_tokens`): a long prompt is forwarded
in chunks of at most that many positions, each attending to the KV cache of the chunks before
it, so no forward takes the whole prompt; the samples and log-probs equal one forward's up to
float rounding, in a left-padded batch of prompts of different lengths, with groups sharing
their prompt, with a kept session resumed, and under speculation."""

from __future__ import annotations

import pytest
from test_engine_hf import spread_model

from posttrain.configs import load_config
from posttrain.configs.engine import SpeculationConfig
from posttrain.engine.hf import HFEngine, HFEngineConfig
from posttrain.engine.sync import make_engine
from posttrain.types import GenerationRequest, Message, SamplingParams


class Widths(HFEngine):
    """The real engine, recording the input width (positions per row) of every forward."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.widths: list[int] = []

    def _forward(self, input_ids, *args, **kwargs):
        self.widths.append(input_ids.shape[1])
        return super()._forward(input_ids, *args, **kwargs)


@pytest.fixture(scope="module")
def model_tok():
    """A random micro model with wide weights, so greedy paths depend on every position."""
    return spread_model(0, max_positions=1024)


def requests(eng: HFEngine, temperature: float = 0.0) -> list[GenerationRequest]:
    """Prompts of about 20 to 300 tokens (left-padded together), one a group of 3."""
    texts = ["short one", "a" * 120, "the quick brown fox " * 14, "b c d e " * 30]
    return [
        GenerationRequest(
            eng.encode_chat([Message("user", t)]),
            SamplingParams(max_tokens=8, temperature=temperature, seed=i, n=3 if i == 2 else 1),
            f"r{i}",
        )
        for i, t in enumerate(texts)
    ]


def same(a, b, tol: float = 1e-4) -> None:
    for ga, gb in zip(a, b, strict=True):
        for x, y in zip(ga, gb, strict=True):
            assert x.token_ids == y.token_ids
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < tol


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_chunked_prefill_gives_the_samples_of_one_forward_and_no_forward_takes_more_than_a_chunk(
    model_tok, temperature
):
    model, tok = model_tok
    whole = Widths(model, tok, config=HFEngineConfig(prefill_chunk_tokens=None))
    chunked = Widths(model, tok, config=HFEngineConfig(prefill_chunk_tokens=37))
    reqs = requests(whole, temperature)
    longest = max(len(r.prompt_ids) for r in reqs)
    assert longest > 200
    same(whole.generate(reqs), chunked.generate(reqs))
    assert max(whole.widths) == longest  # one forward took the whole padded prompt
    assert max(chunked.widths) == 37  # every forward at most one chunk
    assert chunked.stats().prompt_tokens == whole.stats().prompt_tokens  # the same tokens computed


def test_a_resumed_session_prefills_its_rest_in_chunks(model_tok):
    """A later turn whose new tokens pass the chunk: only they are computed, in chunks, and the
    next turn is the one a full prefill gives."""
    model, tok = model_tok
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    full = HFEngine(model, tok, config=HFEngineConfig(context_reuse=False, prefill_chunk_tokens=None))
    on = Widths(model, tok, config=HFEngineConfig(prefill_chunk_tokens=16))
    first = on.encode_chat([Message("user", "hello " * 10)])
    c = on.generate([GenerationRequest(first, greedy, "r", ("s",))])[0][0]
    nxt = first + c.token_ids + on.encode_chat([Message("user", "more words here " * 6)])
    on.widths.clear()
    got = on.generate([GenerationRequest(nxt, greedy, "r", ("s",))])[0][0]
    want = full.generate([GenerationRequest(nxt, greedy)])[0][0]
    assert got.cached_tokens == len(first) + len(c.token_ids)
    assert got.token_ids == want.token_ids
    assert max(abs(p - q) for p, q in zip(got.logprobs, want.logprobs)) < 1e-4
    rest = len(nxt) - got.cached_tokens
    chunks = [16] * (rest // 16) + [rest % 16] * (rest % 16 > 0)
    assert rest > 16 and on.widths[: len(chunks)] == chunks and max(on.widths) == 16  # then 1-token steps


def test_chunked_prefill_under_speculation(model_tok):
    model, tok = model_tok
    spec = SpeculationConfig(kind="suffix")
    whole = HFEngine(model, tok, config=HFEngineConfig(prefill_chunk_tokens=None, speculation=spec))
    chunked = HFEngine(model, tok, config=HFEngineConfig(prefill_chunk_tokens=50, speculation=spec))
    reqs = requests(whole)
    same(whole.generate(reqs), chunked.generate(reqs))


def test_the_run_config_sets_the_chunk_and_refuses_a_bad_one(model_tok):
    model, tok = model_tok
    cfg = load_config(None, ["engine.prefill_chunk_tokens=64"])
    eng = make_engine(cfg.engine, model, tok, seed=0)
    assert isinstance(eng, HFEngine) and eng.config.prefill_chunk_tokens == 64
    assert load_config(None, []).engine.prefill_chunk_tokens == 2048
    with pytest.raises(Exception, match="prefill_chunk_tokens"):
        load_config(None, ["engine.prefill_chunk_tokens=0"])


def test_a_lone_unpadded_prompt_takes_one_fused_forward(model_tok):
    """Nothing padded, nothing cached, sdpa: torch's fused causal kernel holds no L x L scores,
    so chunks would only cost time (measured in bench/RESULTS.md); eager attention is chunked."""
    model, tok = model_tok
    assert model.config._attn_implementation == "sdpa"
    eng = Widths(model, tok, config=HFEngineConfig(prefill_chunk_tokens=37))
    prompt = eng.encode_chat([Message("user", "the quick brown fox " * 10)])
    eng.generate([GenerationRequest(prompt, SamplingParams(max_tokens=1, n=3))])
    assert eng.widths == [len(prompt)]
    model.config._attn_implementation = "eager"
    try:
        eager = Widths(model, tok, config=HFEngineConfig(prefill_chunk_tokens=37))
        eager.generate([GenerationRequest(prompt, SamplingParams(max_tokens=1))])
    finally:
        model.config._attn_implementation = "sdpa"
    assert max(eager.widths) == 37
