"""The hf engine: greedy parity with HF generate, prefix-sharing equivalence,
seeded determinism, the logprob convention, stopping, bad input, weight updates."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.engine.hf import HFEngine, HFEngineConfig
from posttrain.errors import ConfigError, GenerationError, ModelLoadError
from posttrain.model.arch import random_model
from posttrain.types import GenerationRequest, Message, SamplingParams

PROMPTS = ["hello there", "ab", "what is 12+7?", "sort: 3 1 2"]


def spread_model(seed: int = 0, preset: str = "micro", max_positions: int = 512):
    """A random model with wide weights, so greedy paths vary and eos is reachable (and
    depend on every position); `max_positions` for long prompts."""
    model, tok = random_model(preset, seed, max_positions=max_positions)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval(), tok


@pytest.fixture(scope="module")
def model_tok():
    return spread_model(0)


@pytest.fixture()
def engine(model_tok):
    model, tok = model_tok
    return HFEngine(model, tok, seed=1)


def chat(engine: HFEngine, text: str) -> tuple[int, ...]:
    return engine.encode_chat([Message("user", text)])


def flat(groups):
    return [c for g in groups for c in g]


def test_encode_chat_opens_assistant_turn_and_decode_round_trips(engine):
    ids = engine.encode_chat([Message("system", "be brief"), Message("user", "2+2?")])
    assert engine.tokenizer.convert_ids_to_tokens(ids[-1]) == "<|assistant|>"
    assert engine.decode(ids) == "be brief2+2?"
    with pytest.raises(ConfigError, match="messages"):
        engine.encode_chat([])


def test_encode_chat_without_a_chat_template_is_a_config_error(model_tok):
    model, tok = model_tok
    plain = tok.__class__(tokenizer_object=tok.backend_tokenizer, eos_token=tok.eos_token, pad_token=tok.pad_token)
    assert not plain.chat_template
    with pytest.raises(ConfigError, match="chat_template"):
        HFEngine(model, plain).encode_chat([Message("user", "hi")])


def test_greedy_matches_hf_generate_on_a_left_padded_batch(engine, model_tok):
    model, tok = model_tok
    prompts = [chat(engine, t) for t in PROMPTS]
    ours = engine.generate([GenerationRequest(p, SamplingParams(max_tokens=24, temperature=0)) for p in prompts])
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    ref = model.generate(
        ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=24,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    for k, group in enumerate(ours):
        want = ref[k, width:].tolist()
        if tok.eos_token_id in want:
            want = want[: want.index(tok.eos_token_id) + 1]
        assert list(group[0].token_ids) == want


def mixed_requests(engine: HFEngine) -> list[GenerationRequest]:
    return [
        GenerationRequest(chat(engine, "hello there"), SamplingParams(max_tokens=20, n=8, seed=11)),
        GenerationRequest(chat(engine, "ab"), SamplingParams(max_tokens=12, n=5, seed=12, temperature=0.7, top_p=0.9)),
        GenerationRequest(chat(engine, "what is 12+7?"), SamplingParams(max_tokens=16, n=1, seed=13, temperature=0)),
        GenerationRequest(chat(engine, "sort: 3 1 2"), SamplingParams(max_tokens=30, n=6, seed=14, temperature=1.3)),
    ]


@pytest.mark.parametrize("max_rows", [256, 4])
def test_prefix_sharing_gives_the_same_samples_as_repeating_the_prompt(model_tok, max_rows):
    model, tok = model_tok
    shared = HFEngine(model, tok, config=HFEngineConfig(max_batch_rows=max_rows))
    naive = HFEngine(model, tok, config=HFEngineConfig(max_batch_rows=max_rows, prefix_sharing=False))
    reqs = mixed_requests(shared)
    a, b = flat(shared.generate(reqs)), flat(naive.generate(reqs))
    assert len(a) == len(b) == 20
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
        assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < 1e-5
    assert len({x.token_ids for x in a[:8]}) > 1  # a group's samples differ
    assert shared.stats().prompt_tokens < naive.stats().prompt_tokens


@pytest.mark.parametrize("fraction", [0.0, 1.0])
def test_keeping_finished_rows_in_the_batch_changes_nothing(model_tok, fraction):
    model, tok = model_tok
    base = HFEngine(model, tok, config=HFEngineConfig(compact_fraction=0.125))
    other = HFEngine(model, tok, config=HFEngineConfig(compact_fraction=fraction))
    reqs = mixed_requests(base)
    a, b = flat(base.generate(reqs)), flat(other.generate(reqs))
    assert [x.token_ids for x in a] == [y.token_ids for y in b]
    assert [x.finish_reason for x in a] == [y.finish_reason for y in b]
    assert max(abs(p - q) for x, y in zip(a, b) for p, q in zip(x.logprobs, y.logprobs)) < 1e-5


def test_on_tokens_sees_each_new_token_of_unfinished_rows_once(model_tok):
    model, tok = model_tok
    streamed: dict[tuple[int, int], list[int]] = {}

    def on_tokens(request, sample, ids):
        streamed.setdefault((request, sample), []).extend(ids)

    engine = HFEngine(model, tok, config=HFEngineConfig(compact_fraction=1.0))
    groups = engine.generate(mixed_requests(engine), on_tokens=on_tokens)
    for i, group in enumerate(groups):
        for j, c in enumerate(group):
            assert tuple(streamed[(i, j)]) == c.token_ids
    streamed.clear()
    engine.generate(mixed_requests(engine))  # the callback belongs to its call only
    assert streamed == {}


def test_check_finite_refuses_nonfinite_logits_and_is_off_by_default(model_tok):
    import copy

    model, tok = model_tok
    broken = copy.deepcopy(model)
    with torch.no_grad():
        broken.get_input_embeddings().weight.fill_(float("nan"))
    req = [GenerationRequest(chat(HFEngine(broken, tok), "hi"), SamplingParams(max_tokens=2, seed=0))]
    with pytest.raises(GenerationError, match="non-finite logits"):
        HFEngine(broken, tok, config=HFEngineConfig(check_finite=True)).generate(req)
    HFEngine(broken, tok).generate(req)  # off (the training engine's default): it samples


def test_prefix_sharing_computes_each_prompt_once(engine):
    p = chat(engine, "hello there")
    engine.generate([GenerationRequest(p, SamplingParams(max_tokens=4, n=8, seed=0))])
    stats = engine.stats()
    assert stats.prompt_tokens == len(p)


def test_a_seeded_request_gives_the_same_samples_whatever_else_is_in_the_batch(model_tok):
    model, tok = model_tok
    engine = HFEngine(model, tok, config=HFEngineConfig(max_batch_rows=3))
    reqs = mixed_requests(engine)
    alone = engine.generate([reqs[3]])[0]
    together = engine.generate(reqs)[3]
    other = HFEngine(model, tok, seed=99).generate(list(reversed(reqs)))[0]
    assert [c.token_ids for c in alone] == [c.token_ids for c in together] == [c.token_ids for c in other]


def test_unseeded_requests_follow_the_engine_seed(engine):
    req = GenerationRequest(chat(engine, "ab"), SamplingParams(max_tokens=16, n=4))
    engine.seed(5)
    first = [c.token_ids for c in engine.generate([req])[0]]
    engine.seed(5)
    again = [c.token_ids for c in engine.generate([req])[0]]
    engine.seed(6)
    other = [c.token_ids for c in engine.generate([req])[0]]
    assert first == again and first != other


def recomputed_logprobs(model, prompt, tokens, temperature):
    """log_softmax(logits / T) of each completion token from one full forward."""
    ids = torch.tensor([list(prompt) + list(tokens)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    t = temperature if temperature > 0 else 1.0
    return torch.log_softmax(logits / t, -1).gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.6, 0.8), (0.0, 1.0)])
def test_logprobs_are_log_softmax_of_tempered_logits(engine, model_tok, temperature, top_p):
    model, _ = model_tok
    p = chat(engine, "what is 12+7?")
    req = GenerationRequest(p, SamplingParams(max_tokens=20, n=3, seed=2, temperature=temperature, top_p=top_p))
    for c in engine.generate([req])[0]:
        want = recomputed_logprobs(model, p, c.token_ids, temperature)
        assert torch.allclose(torch.tensor(c.logprobs), want, atol=1e-4)
        assert all(lp <= 0 for lp in c.logprobs)


def test_eos_stops_a_row_and_is_not_part_of_the_text(engine):
    req = GenerationRequest(chat(engine, "hello there"), SamplingParams(max_tokens=60, n=24, seed=3))
    group = engine.generate([req])[0]
    stopped = [c for c in group if c.finish_reason == "stop"]
    capped = [c for c in group if c.finish_reason == "length"]
    assert stopped and capped  # the spread model reaches eos sometimes
    for c in stopped:
        assert c.token_ids[-1] == engine.eos_token_id and engine.eos_token_id not in c.token_ids[:-1]
        assert c.text == engine.decode(c.token_ids[:-1]) and len(c.logprobs) == len(c.token_ids)
    for c in capped:
        assert len(c.token_ids) == 60 and engine.eos_token_id not in c.token_ids
    assert engine.stats().generated_tokens == sum(len(c.token_ids) for c in group)


def test_stop_strings_end_the_completion_before_the_stop(engine):
    p = chat(engine, "hello there")
    full = engine.generate([GenerationRequest(p, SamplingParams(max_tokens=30, temperature=0))])[0][0]
    assert full.finish_reason == "length" and len(full.text) == 30
    stop = full.text[10:13]
    cut = engine.generate([GenerationRequest(p, SamplingParams(max_tokens=30, temperature=0, stop=("#@!", stop)))])[0][
        0
    ]
    first = full.text.find(stop)
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[:first]
    assert cut.token_ids == full.token_ids[: first + len(stop)]


def test_generation_stops_at_the_models_max_positions(model_tok):
    model, tok = model_tok
    engine = HFEngine(model, tok)
    limit = model.config.max_position_embeddings
    prompt = tuple([20] * (limit - 5))
    c = engine.generate([GenerationRequest(prompt, SamplingParams(max_tokens=50, temperature=0))])[0][0]
    assert len(c.token_ids) == 5 and c.finish_reason == "length" or c.finish_reason == "stop"
    last = engine.generate([GenerationRequest(tuple([20] * (limit - 1)), SamplingParams(max_tokens=50, n=3, seed=1))])
    assert all(len(c.token_ids) == 1 for c in last[0])


def test_no_requests_give_no_groups(engine):
    assert engine.generate([]) == []


@pytest.mark.parametrize(
    "prompt,params,field",
    [
        ((), SamplingParams(), "prompt_ids"),
        ((5,), SamplingParams(max_tokens=0), "max_tokens"),
        ((5,), SamplingParams(n=0), "params.n"),
        ((5,), SamplingParams(temperature=-1), "temperature"),
        ((5,), SamplingParams(temperature=math.nan), "temperature"),
        ((5,), SamplingParams(top_p=0), "top_p"),
        ((5,), SamplingParams(stop=("",)), "stop"),
        ((5,), SamplingParams(stop="ab"), "params.stop must be a tuple"),
        ((5, 10_000), SamplingParams(), "prompt_ids"),
        ((5,) * 512, SamplingParams(), "max_position_embeddings"),
    ],
)
def test_bad_requests_raise_a_config_error_naming_the_field(engine, prompt, params, field):
    good = GenerationRequest((5, 6), SamplingParams(max_tokens=2))
    with pytest.raises(ConfigError, match=field) as info:
        engine.generate([good, GenerationRequest(prompt, params)])
    assert "requests[1]" in str(info.value)
    assert engine.stats().forward_calls == 0


def test_update_weights_in_place_state_dict_and_checkpoint(tmp_path, model_tok):
    model, tok = spread_model(0)
    other, _ = spread_model(7)
    engine = HFEngine(model, tok)
    req = GenerationRequest(chat(engine, "ab"), SamplingParams(max_tokens=12, temperature=0))
    before = engine.generate([req])[0][0]
    assert before.model_version == 0 and engine.version == 0
    assert engine.update_weights(None) == 1
    target = HFEngine(other, tok).generate([req])[0][0].token_ids
    assert engine.update_weights(other.state_dict()) == 2
    after = engine.generate([req])[0][0]
    assert after.token_ids == target and after.model_version == 2
    back, _ = spread_model(0)
    back.save_pretrained(tmp_path)
    assert engine.update_weights(tmp_path) == 3
    assert engine.generate([req])[0][0].token_ids == before.token_ids


def test_update_weights_rejects_a_mismatched_state_dict(engine):
    with pytest.raises(ModelLoadError, match="lacks"):
        engine.update_weights({"model.norm.weight": torch.ones(32)})
    with pytest.raises(ModelLoadError, match="lacks"):
        engine.update_weights({})
    state = dict(engine.model.state_dict())
    state["bogus"] = torch.zeros(1)
    with pytest.raises(ModelLoadError, match="bogus"):
        engine.update_weights(state)
    assert engine.version == 0


def test_from_pretrained_loads_a_directory(tmp_path, model_tok):
    model, tok = model_tok
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded = HFEngine.from_pretrained(tmp_path, device="cpu", dtype="float32")
    req = GenerationRequest(chat(loaded, "ab"), SamplingParams(max_tokens=10, temperature=0))
    assert loaded.generate([req])[0][0].token_ids == HFEngine(model, tok).generate([req])[0][0].token_ids
    with pytest.raises(ConfigError, match="dtype"):
        HFEngine.from_pretrained(tmp_path, device="cpu", dtype="float77")


def test_bfloat16_generation_runs_and_keeps_logprobs_finite(tmp_path, model_tok):
    model, tok = model_tok
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    engine = HFEngine.from_pretrained(tmp_path, device="cpu", dtype="bfloat16")
    assert next(engine.model.parameters()).dtype == torch.bfloat16
    group = engine.generate([GenerationRequest(chat(engine, "ab"), SamplingParams(max_tokens=8, n=3, seed=1))])[0]
    assert all(math.isfinite(lp) and lp <= 0 for c in group for lp in c.logprobs)


def test_a_failing_forward_is_a_generation_error(model_tok, monkeypatch):
    model, tok = model_tok
    engine = HFEngine(model, tok)

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA out of memory (simulated)")

    monkeypatch.setattr(engine, "_forward", broken)
    with pytest.raises(GenerationError, match="out of memory") as info:
        engine.generate([GenerationRequest((5, 6), SamplingParams(max_tokens=2))])
    assert info.value.kind == "generation" and not model.training


def test_generate_restores_the_training_mode(model_tok):
    model, tok = model_tok
    engine = HFEngine(model, tok)
    model.train()
    engine.generate([GenerationRequest((5, 6), SamplingParams(max_tokens=2))])
    assert model.training
    model.eval()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_samples(model_tok):
    model, tok = model_tok
    reqs = mixed_requests(HFEngine(model, tok))
    cpu = flat(HFEngine(model, tok).generate(reqs))
    gpu_model, _ = spread_model(0)
    gpu = flat(HFEngine(gpu_model, tok, device="cuda").generate(reqs))
    same = sum(a.token_ids == b.token_ids for a, b in zip(cpu, gpu))
    assert same >= len(cpu) - 2  # float differences may flip a rare near-tie
    for a, b in zip(cpu, gpu):
        if a.token_ids == b.token_ids:
            assert max(abs(p - q) for p, q in zip(a.logprobs, b.logprobs)) < 1e-3


def sliding_window_model():
    """A micro Qwen2 whose layers use sliding-window attention (window 6)."""
    from transformers import AutoModelForCausalLM

    from posttrain.model.arch import make_config
    from posttrain.model.tokenizer import build_tokenizer

    tok = build_tokenizer()
    cfg = make_config("micro", len(tok), tok.pad_token_id, tok.eos_token_id)
    cfg.use_sliding_window, cfg.sliding_window, cfg.max_window_layers = True, 6, 0
    cfg.layer_types = ["sliding_attention"] * cfg.num_hidden_layers
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    return model, tok


def test_models_with_other_layer_types_fall_back_to_the_dynamic_cache():
    from transformers import DynamicCache

    from posttrain.engine.kvcache import SlabLayer, new_cache

    model, tok = sliding_window_model()
    assert isinstance(new_cache(model.config, 10, 2), DynamicCache)
    plain, _ = spread_model(0)
    assert all(isinstance(layer, SlabLayer) for layer in new_cache(plain.config, 10, 2).layers)
    shared = HFEngine(model, tok)
    naive = HFEngine(model, tok, config=HFEngineConfig(prefix_sharing=False))
    reqs = mixed_requests(shared)
    a, b = flat(shared.generate(reqs)), flat(naive.generate(reqs))
    assert [x.token_ids for x in a] == [y.token_ids for y in b]
    p = reqs[0].prompt_ids
    ids = torch.tensor([p])
    ref = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=16,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )[0, len(p) :].tolist()
    ours = shared.generate([GenerationRequest(p, SamplingParams(max_tokens=16, temperature=0))])[0][0]
    assert list(ours.token_ids) == ref[: len(ours.token_ids)] and len(ours.token_ids) > 1


def test_a_large_vocabulary_model_shares_prefixes_exactly_too():
    """Above GUMBEL_MAX_VOCAB the engine samples by inverse CDF; prefix sharing
    and batching still change nothing."""
    from transformers import AutoModelForCausalLM

    from posttrain.engine.sampling import GUMBEL_MAX_VOCAB
    from posttrain.model.arch import make_config
    from posttrain.model.tokenizer import build_tokenizer

    tok = build_tokenizer()
    cfg = make_config("micro", GUMBEL_MAX_VOCAB + 500, tok.pad_token_id, tok.eos_token_id)
    torch.manual_seed(4)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    shared = HFEngine(model, tok, config=HFEngineConfig(max_batch_rows=5))
    naive = HFEngine(model, tok, config=HFEngineConfig(prefix_sharing=False))
    reqs = mixed_requests(shared)
    a, b = flat(shared.generate(reqs)), flat(naive.generate(reqs))
    assert [x.token_ids for x in a] == [y.token_ids for y in b]
    assert max(abs(p - q) for x, y in zip(a, b) for p, q in zip(x.logprobs, y.logprobs)) < 1e-5
    assert len({x.token_ids for x in a[:8]}) > 1
    assert any(t >= len(tok) for x in a for t in x.token_ids)  # the whole vocabulary is in play
