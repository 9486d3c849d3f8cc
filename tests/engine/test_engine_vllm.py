"""The vllm engine against a real vLLM server (the `vllm` lane: `make test-vllm`).

One server (LoRA enabled) is started for the module from .venv-vllm on a short-pretrained
copy of the embedded base's architecture (the tiny preset: tied embeddings, vocabulary
104, head_dim 32). Tolerances: vLLM's and posttrain's fp32 forward passes differ by
float rounding only; measured |dlogprob| <= 2e-6, asserted <= 1e-4.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from posttrain.configs.engine import EngineConfig, VLLMConfig
from posttrain.engine.sync import WeightSync
from posttrain.engine.vllm import LM_HEAD_FILE, VLLMEngine, default_python, export_for_vllm
from posttrain.errors import ConfigError, WeightSyncError
from posttrain.types import GenerationRequest, SamplingParams

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not default_python().exists(), reason="no .venv-vllm (make vllm-venv)"),
]

TOL = 1e-4
"""|dlogprob| allowed between vLLM and the trainer's own forward pass (fp32 both)."""
PROMPTS = [(2, 10, 11, 12, 13), (2, 20, 21), (2, 30, 31, 32, 33, 34, 35, 36, 37), (2, 14, 40, 41, 7)]


@pytest.fixture(scope="module")
def engine(tiny_base, tmp_path_factory):
    from posttrain.model.arch import load_tokenizer

    run_dir = tmp_path_factory.mktemp("run")
    eng = VLLMEngine.start(
        tiny_base, run_dir, load_tokenizer(tiny_base), VLLMConfig(), lora_rank=8,
        seed=0, timeout_s=30, push_retries=1,
    )  # fmt: skip
    yield eng
    eng.close()
    assert not eng.server or eng.server.proc is None


def _policy(tiny_base, lora: bool = False):
    """A fresh trainer on the base (LoRA rank 8 when `lora`) and its model."""
    from posttrain.configs.trainer import LoraConfig, TrainerConfig
    from posttrain.model.arch import load_model
    from posttrain.trainer.trainer import Trainer

    model, _ = load_model(tiny_base, device="cpu")
    cfg = TrainerConfig(lr=3e-2, lora=LoraConfig(rank=8, alpha=16) if lora else None)
    return Trainer(model, cfg)


def _hf(model, tokenizer):
    from posttrain.engine.hf import HFEngine

    return HFEngine(model, tokenizer, seed=0)


def _greedy(n: int = 1, max_tokens: int = 8) -> list[GenerationRequest]:
    return [GenerationRequest(p, SamplingParams(max_tokens=max_tokens, temperature=0.0, n=n, seed=3)) for p in PROMPTS]


def _assert_same(a, b) -> None:
    """Token ids equal, log-probs within TOL, group by group."""
    assert len(a) == len(b)
    for ga, gb in zip(a, b):
        assert [c.token_ids for c in ga] == [c.token_ids for c in gb]
        for ca, cb in zip(ga, gb):
            assert max(abs(x - y) for x, y in zip(ca.logprobs, cb.logprobs)) <= TOL


def _train(trainer, engine, steps: int = 3) -> None:
    """Real optimizer steps on groups the engine sampled (reward: the first token is odd)."""
    from posttrain.trainer.batch import TrainBatch, TrainRow

    for s in range(steps):
        reqs = [GenerationRequest(p, SamplingParams(max_tokens=6, temperature=1.0, n=4, seed=100 + s)) for p in PROMPTS]
        rows = [
            TrainRow(r.prompt_ids, c.token_ids, c.logprobs, _reward(c), f"{s}:{i}", (1,) * len(c.token_ids))
            for i, (r, g) in enumerate(zip(reqs, engine.generate(reqs)))
            for c in g
        ]
        trainer.step(TrainBatch(tuple(rows)))


def _reward(c) -> float:
    return float(c.token_ids[0] % 2)


def _params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _changed(before, model) -> bool:
    return any(not torch.equal(before[n], p) for n, p in model.named_parameters())


def test_export_unties_embeddings_exactly(tiny_base, tmp_path):
    from safetensors.torch import load_file

    cfg = json.loads((Path(tiny_base) / "config.json").read_text())
    assert (
        cfg["tie_word_embeddings"]
        and cfg["vocab_size"] == 104
        and cfg["hidden_size"] // cfg["num_attention_heads"] == 32
    )
    out = export_for_vllm(tiny_base, tmp_path / "x")
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    assert json.loads((Path(tiny_base) / "config.json").read_text())["tie_word_embeddings"]  # the original untouched
    head = load_file(str(out / LM_HEAD_FILE))["lm_head.weight"]
    assert torch.equal(head, load_file(str(out / "model.safetensors"))["model.embed_tokens.weight"])


def test_greedy_equals_hf_engine(engine, tiny_base):
    from posttrain.model.arch import load_model

    model, tok = load_model(tiny_base, device="cpu")
    hf = _hf(model, tok)
    _assert_same(engine.generate(_greedy(n=2)), hf.generate(_greedy(n=2)))
    assert all(c.model_version == engine.version for g in engine.generate(_greedy()) for c in g)


def test_sampled_logprobs_are_the_tempered_distribution_and_seeded(engine, tiny_base):
    """At T = 0.7: each log-prob is log_softmax(logits / 0.7) of the sampled token under the
    trainer's own forward pass (what the hf engine reports); a seed gives the same samples alone
    or batched with other requests; another seed gives others."""
    from posttrain.model.arch import load_model

    model, _ = load_model(tiny_base, device="cpu")
    t = 0.7
    reqs = [GenerationRequest(p, SamplingParams(max_tokens=8, temperature=t, n=4, seed=11)) for p in PROMPTS]
    out = engine.generate(reqs)
    for req, group in zip(reqs, out):
        for c in group:
            ids = torch.tensor([list(req.prompt_ids) + list(c.token_ids)])
            with torch.no_grad():
                logits = model(ids).logits[0, len(req.prompt_ids) - 1 : -1] / t
            ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
            assert max(abs(a - b) for a, b in zip(ref.tolist(), c.logprobs)) <= TOL
    alone = engine.generate(reqs[1:2])
    assert [c.token_ids for c in alone[0]] == [c.token_ids for c in out[1]]
    assert len({c.token_ids for g in out for c in g}) > len(PROMPTS)  # samples differ within groups
    other = engine.generate([GenerationRequest(PROMPTS[2], SamplingParams(max_tokens=8, temperature=t, n=4, seed=12))])
    assert [c.token_ids for c in other[0]] != [c.token_ids for c in out[2]]


def test_top_p_below_one_is_refused(engine):
    with pytest.raises(ConfigError, match="top_p"):
        engine.generate([GenerationRequest(PROMPTS[0], SamplingParams(max_tokens=4, top_p=0.9))])


def test_full_push_serves_the_trainers_new_policy(engine, tiny_base, tmp_path):
    trainer = _policy(tiny_base)
    before = _params(trainer.model)
    old = engine.generate(_greedy())
    _train(trainer, engine)
    assert _changed(before, trainer.model)
    sync = WeightSync(EngineConfig(kind="vllm"), engine, trainer, tmp_path)
    version = sync.push()
    assert version == engine.version
    new = engine.generate(_greedy())
    _assert_same(new, _hf(trainer.model, engine.tokenizer).generate(_greedy()))
    assert [c.logprobs for g in new for c in g] != [c.logprobs for g in old for c in g]
    assert all(c.model_version == version for g in new for c in g)
    assert (sorted((tmp_path / "weights").iterdir())[-1] / LM_HEAD_FILE).exists()  # pushed untied


def test_lora_push_serves_the_adapter(engine, tiny_base, tmp_path):
    engine.update_weights(Path(engine.server.dir) / "model")  # the base again: the adapter goes on top of it
    trainer = _policy(tiny_base, lora=True)
    before = _params(trainer.model)
    _train(trainer, engine)
    assert _changed(before, trainer.model)
    sync = WeightSync(EngineConfig(kind="vllm"), engine, trainer, tmp_path)
    for _ in range(2):  # the second push loads in place over the first adapter
        version = sync.push()
        assert engine.model == "policy"
        _assert_same(engine.generate(_greedy()), _hf(trainer.model, engine.tokenizer).generate(_greedy()))
        _train(trainer, engine, steps=1)
    assert version == engine.version


def test_test_switches_skip_the_load_and_the_prefix_cache_reset(engine, tiny_base, tmp_path):
    """The test-only switches the verified-sync probe is tested with. skip_push: the version moves,
    the served weights do not. skip_prefix_reset: a long prompt cached under the old weights is
    continued from its stale cache (the outputs differ from the trainer's policy) until a push
    that resets it."""
    from posttrain.model.arch import load_model

    engine.update_weights(Path(engine.server.dir) / "model")  # the base
    trainer = _policy(tiny_base)
    _train(trainer, engine)
    # the probe off: it would catch both switches (tests/engine/test_sync_probe_vllm.py); here the switches
    # themselves are under test
    sync = WeightSync(EngineConfig(kind="vllm", verify_sync="off"), engine, trainer, tmp_path)
    base = _hf(load_model(tiny_base, device="cpu")[0], engine.tokenizer)
    policy = _hf(trainer.model, engine.tokenizer)
    long = [GenerationRequest((2, *[10 + k % 60 for k in range(300)]), SamplingParams(max_tokens=4, temperature=0.0))]

    def differs(a, b) -> bool:
        return max(abs(x - y) for x, y in zip(a[0][0].logprobs, b[0][0].logprobs)) > TOL

    assert differs(base.generate(_greedy()), policy.generate(_greedy()))
    engine.skip_push = True
    try:
        version = sync.push()
    finally:
        engine.skip_push = False
    assert version == engine.version and not differs(engine.generate(_greedy()), base.generate(_greedy()))
    engine.generate(long)  # cached under the base weights
    engine.skip_prefix_reset = True
    try:
        sync.push()
        stale = engine.generate(long)
    finally:
        engine.skip_prefix_reset = False
    assert differs(stale, policy.generate(long))
    sync.push()
    _assert_same(engine.generate(long), policy.generate(long))


def test_killed_server_is_restarted_and_resynced(engine, tiny_base, tmp_path):
    trainer = _policy(tiny_base)
    _train(trainer, engine, steps=2)
    version = WeightSync(EngineConfig(kind="vllm"), engine, trainer, tmp_path).push()
    want = _hf(trainer.model, engine.tokenizer).generate(_greedy())
    restarts = engine.stats()["restarts"]
    engine.server.kill(signal.SIGKILL)
    got = engine.generate(_greedy())
    assert engine.stats()["restarts"] == restarts + 1
    _assert_same(got, want)  # the re-synced weights, not the base
    assert engine.version == version and all(c.model_version == version for g in got for c in g)


def test_hung_server_times_out_is_counted_and_restarted(engine, tiny_base):
    """A stopped server (SIGSTOP: it holds the connection and never answers): the request times out
    (timeout_s), /health fails, the server is restarted and the request retried and answered."""
    want = engine.generate(_greedy())
    stats = engine.stats()
    engine.server.kill(signal.SIGSTOP)
    got = engine.generate(_greedy())
    after = engine.stats()
    assert after["restarts"] == stats["restarts"] + 1
    assert after["request_retries"] > stats["request_retries"]
    _assert_same(got, want)


def test_partial_checkpoint_is_refused_before_it_is_sent(engine, tmp_path):
    """vLLM's reload of a folder holding only some tensors answers success and breaks the model
    (NaN log-probs, measured): the engine refuses such a push itself; nothing reaches the server."""
    from safetensors.torch import load_file, save_file

    want, version, stats = engine.generate(_greedy()), engine.version, engine.stats()
    src = Path(engine.server.dir) / "model"
    part = tmp_path / "part"
    part.mkdir()
    (part / "config.json").write_text((src / "config.json").read_text())
    name = "model.layers.0.self_attn.q_proj.weight"
    save_file({name: load_file(str(src / "model.safetensors"))[name] * 1.5}, str(part / "model.safetensors"))
    with pytest.raises(WeightSyncError, match="lacks"):
        engine.update_weights(part)
    assert engine.version == version and engine.stats() == stats
    _assert_same(engine.generate(_greedy()), want)


def test_refused_load_raises_after_retries_and_keeps_the_old_weights(engine, tmp_path):
    """A checkpoint vLLM refuses (every tensor named, one of the wrong shape): each attempt is
    counted, the server restarted onto the last acknowledged weights, and after push_retries the
    push raises; the version does not move. A torn file is refused before it is sent."""
    from safetensors.torch import load_file, save_file

    want = engine.generate(_greedy())
    version, stats = engine.version, engine.stats()
    src = Path(engine.server.dir) / "model"
    torn = tmp_path / "torn"
    torn.mkdir()
    (torn / "config.json").write_text((src / "config.json").read_text())
    (torn / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes()[:5000])
    with pytest.raises(WeightSyncError, match="not a readable safetensors"):
        engine.update_weights(torn)
    assert engine.stats() == stats
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((src / "config.json").read_text())
    state = {**load_file(str(src / "model.safetensors")), **load_file(str(src / LM_HEAD_FILE))}
    state["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(7, 5)
    save_file(state, str(bad / "model.safetensors"))
    with pytest.raises(WeightSyncError, match="failed 2 times"):
        engine.update_weights(bad)
    after = engine.stats()
    assert after["push_failures"] == stats["push_failures"] + 2
    assert after["restarts"] == stats["restarts"] + 2
    assert engine.version == version
    _assert_same(engine.generate(_greedy()), want)


# `posttrain train` with engine.kind vllm, its server killed mid-run: tests/engine/test_engine_vllm_train.py
# (one run shared by the kill, push, weights and held-out accuracy tests).
