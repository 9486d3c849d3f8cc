"""The int8 KV cache (issue 39 item 3, `engine.kv_dtype: int8`): int8 values with one float32
scale per (row, head, position), dequantized at each attention. The rounding is bounded by
half a scale step, the slabs take 1 + 4 / head_dim bytes per value instead of 4, the logits
move (it is lossy, and really on) but stay close, and kept sessions, prefix sharing, chunked
prefill and speculation work on it unchanged; a model without the slab cache is refused."""

from __future__ import annotations

import pytest
import torch
from test_engine_hf import spread_model

from posttrain.configs.engine import SpeculationConfig
from posttrain.engine.hf import HFEngine, HFEngineConfig
from posttrain.engine.kvcache import SlabLayer, dequantize, quantize
from posttrain.errors import ConfigError
from posttrain.types import GenerationRequest, Message, SamplingParams


@pytest.fixture(scope="module")
def model_tok():
    return spread_model(0, max_positions=1024)


def test_quantize_by_hand_and_within_half_a_step():
    # absmax 1.27 -> scale 0.01: 1.27 -> 127, -0.5 -> -50, 0.004 -> 0 (rounds down), 0.005 -> 0 or 1
    q, s = quantize(torch.tensor([[1.27, -0.5, 0.004, 0.0151]]))
    assert q.dtype == torch.int8 and q.tolist() == [[127, -50, 0, 2]]
    assert s.shape == (1, 1) and abs(float(s) - 0.01) < 1e-9
    zq, zs = quantize(torch.zeros(2, 4))  # an all-zero vector: scale 1, zeros back
    assert zq.abs().sum() == 0 and torch.equal(zs, torch.ones(2, 1))
    x = torch.randn(3, 5, 7, 32, generator=torch.Generator().manual_seed(1))
    q, s = quantize(x)
    back = dequantize(q, s, torch.float32)
    assert ((back - x).abs() <= s / 2 + 1e-7).all()  # round to nearest: half a step at most
    q2, s2 = quantize(back)  # re-quantizing a dequantized vector gives it back (sessions preload)
    assert torch.equal(q2, q) and torch.allclose(s2, s)


def test_an_int8_slab_takes_a_quarter_of_the_bytes_and_reads_back_within_a_step():
    k, v = torch.randn(2, 4, 10, 32), torch.randn(2, 4, 10, 32)
    full, small = SlabLayer(16, 3), SlabLayer(16, 3, int8=True)
    fk, fv = full.update(k, v)
    sk, sv = small.update(k, v)
    assert torch.equal(fk, k) and small._k.dtype == torch.int8
    assert small.nbytes() / full.nbytes() == pytest.approx((1 + 4 / 32) / 4)
    _, ks = quantize(k)
    assert ((sk - k).abs() <= ks / 2 + 1e-6).all() and (sk - k).abs().max() > 0
    small.reorder_cache(torch.tensor([1, 1, 0]))  # a group copy: 3 rows from 2
    rk, _ = small.update(torch.zeros(3, 4, 1, 32), torch.zeros(3, 4, 1, 32))
    assert torch.equal(rk[0, :, :10], sk[1]) and torch.equal(rk[2, :, :10], sk[0]) and rk[:, :, 10].abs().sum() == 0


def _requests(eng: HFEngine, n: int = 1) -> list[GenerationRequest]:
    texts = ["a short one", "the quick brown fox " * 8, "b c d e " * 20]
    return [
        GenerationRequest(eng.encode_chat([Message("user", t)]), SamplingParams(max_tokens=10, temperature=0.0, n=n))
        for t in texts
    ]


def test_int8_moves_the_logprobs_a_little_and_really_quantizes(model_tok):
    model, tok = model_tok
    full = HFEngine(model, tok)
    small = HFEngine(model, tok, config=HFEngineConfig(kv_dtype="int8"))
    a, b = full.generate(_requests(full)), small.generate(_requests(small))
    gaps = [abs(p - q) for ga, gb in zip(a, b) for x, y in zip(ga, gb) for p, q in zip(x.logprobs[:1], y.logprobs[:1])]
    assert 0 < max(gaps) < 0.1  # the first token's log-prob: moved by the rounding, not far


@pytest.mark.parametrize("spec", ["off", "suffix"])
def test_int8_with_sessions_groups_chunks_and_speculation_matches_int8_without(model_tok, spec):
    """Kept sessions are stored dequantized and re-quantized exactly on resume, so an int8
    engine that reuses contexts, shares prompts, prefills in chunks and speculates samples what
    a plain int8 engine samples (up to float rounding)."""
    model, tok = model_tok
    plain = HFEngine(model, tok, config=HFEngineConfig(kv_dtype="int8", context_reuse=False, prefix_sharing=False))
    fancy = HFEngine(
        model,
        tok,
        config=HFEngineConfig(kv_dtype="int8", prefill_chunk_tokens=16, speculation=SpeculationConfig(kind=spec)),
    )
    first = plain.encode_chat([Message("user", "hello there " * 4)])
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    c1 = fancy.generate([GenerationRequest(first, greedy, "r", ("s",))])[0][0]
    nxt = first + c1.token_ids + plain.encode_chat([Message("user", "and more " * 4)])
    c2 = fancy.generate([GenerationRequest(nxt, greedy, "r", ("s",))])[0][0]
    assert c2.cached_tokens == len(first) + len(c1.token_ids)
    want1 = plain.generate([GenerationRequest(first, greedy)])[0][0]
    want2 = plain.generate([GenerationRequest(nxt, greedy)])[0][0]
    assert (c1.token_ids, c2.token_ids) == (want1.token_ids, want2.token_ids)
    assert max(abs(p - q) for p, q in zip(c2.logprobs, want2.logprobs)) < 1e-4
    grouped = fancy.generate(_requests(fancy, n=3))
    alone = plain.generate(_requests(plain, n=3))
    assert [[c.token_ids for c in g] for g in grouped] == [[c.token_ids for c in g] for g in alone]


def test_int8_on_a_model_without_the_slab_cache_is_refused():
    from transformers import AutoModelForCausalLM

    from posttrain.model.arch import make_config
    from posttrain.model.tokenizer import build_tokenizer

    tok = build_tokenizer()
    cfg = make_config("micro", len(tok), tok.pad_token_id, tok.eos_token_id)
    cfg.use_sliding_window, cfg.sliding_window, cfg.max_window_layers = True, 6, 0
    cfg.layer_types = ["sliding_attention"] * cfg.num_hidden_layers  # no slab cache for these layers
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with pytest.raises(ConfigError, match="kv_dtype int8"):
        HFEngine(model, tok, config=HFEngineConfig(kv_dtype="int8"))
    HFEngine(model, tok)  # auto: fine
