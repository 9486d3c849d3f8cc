"""Speculative decoding through the vllm engine (`engine.speculation.kind: suffix` with
`engine.kind: vllm`, the `vllm` lane): the server posttrain starts drafts with vLLM's n-gram
lookup, greedy outputs and log-probs stay the policy's own, the server's draft counters reach
the metrics row's figures, and a sampled request is refused (vLLM's log-probs of drafted tokens
at T > 0 are not the policy's). The config's refusals: tests/engine/test_engine_spec.py."""

from __future__ import annotations

import pytest

from posttrain.configs.engine import SpeculationConfig, VLLMConfig
from posttrain.engine.speculate import acceptance_row
from posttrain.engine.vllm import VLLMEngine, default_python
from posttrain.errors import ConfigError
from posttrain.types import GenerationRequest, SamplingParams

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not default_python().exists(), reason="no .venv-vllm (make vllm-venv)"),
]

TOL = 1e-4
# prompts that repeat themselves, so the n-gram lookup finds something to draft
PROMPTS = [(2, 10, 11, 12, 10, 11, 12, 10, 11), (2, 20, 21, 20, 21, 20), (2, 30, 31, 32, 33, 30, 31, 32)]
SPEC = SpeculationConfig(kind="suffix", max_draft=4, max_match=3)


@pytest.fixture(scope="module")
def spec_engine(tiny_base, tmp_path_factory):
    from posttrain.model.arch import load_tokenizer

    eng = VLLMEngine.start(
        tiny_base, tmp_path_factory.mktemp("run"), load_tokenizer(tiny_base), VLLMConfig(),
        speculation=SPEC, seed=0, timeout_s=60,
    )  # fmt: skip
    yield eng
    eng.close()


def test_the_server_is_started_with_vllms_ngram_drafter(spec_engine):
    cmd = spec_engine.server.command()
    spec = cmd[cmd.index("--speculative-config") + 1]
    assert '"method": "ngram"' in spec and '"num_speculative_tokens": 4' in spec and '"prompt_lookup_max": 3' in spec


def test_greedy_tokens_and_logprobs_are_the_policys_and_the_drafts_are_counted(spec_engine, tiny_base):
    from posttrain.engine.hf import HFEngine
    from posttrain.model.arch import load_model

    model, tok = load_model(tiny_base, device="cpu")
    reqs = [GenerationRequest(p, SamplingParams(max_tokens=24, temperature=0.0, seed=3)) for p in PROMPTS]
    before = spec_engine.counters()
    got = spec_engine.generate(reqs)
    want = HFEngine(model, tok, seed=0).generate(reqs)
    for ga, gb in zip(got, want):
        assert [c.token_ids for c in ga] == [c.token_ids for c in gb]
        for ca, cb in zip(ga, gb):
            assert max(abs(x - y) for x, y in zip(ca.logprobs, cb.logprobs)) <= TOL
    now = spec_engine.counters()
    assert now["spec_rows"] > before.get("spec_rows", 0), now  # the server drafted and verified
    assert now["spec_proposed"] >= now["spec_accepted"] >= 0
    row = acceptance_row(now, before)
    assert 0.0 <= row["spec_acceptance"] <= 1.0 and row["spec_accepted_len"] >= 1.0
    assert "spec_acceptance_d1" in row


def test_sampled_requests_are_refused(spec_engine):
    """vLLM 0.32 reports log-probs that are not the policy's for tokens it drafted at T > 0 (measured
    on this server: 0.0 for an accepted draft token, another value after a rejection), so a sampled
    request fails loudly instead of handing the trainer wrong behaviour log-probs."""
    req = GenerationRequest(PROMPTS[0], SamplingParams(max_tokens=8, temperature=0.8, n=2, seed=7))
    with pytest.raises(ConfigError, match="greedily only"):
        spec_engine.generate([req])


def test_counters_survive_a_server_restart(spec_engine):
    """vLLM's counters start again from 0 with a new server process; the engine's do not fall."""
    before = spec_engine.counters()
    spec_engine._spec_last = {k: v + 1000 for k, v in spec_engine._spec_last.items()}  # as if the server restarted
    after = spec_engine.counters()
    assert all(after[k] >= before[k] for k in before if k.startswith("spec_")), (before, after)


def test_counters_hold_while_the_metrics_route_does_not_answer(spec_engine, monkeypatch):
    """A server restarting cannot answer /metrics: the metrics row gets the totals as last read."""
    import httpx

    before = spec_engine.counters()

    def down(*args, **kwargs):
        raise httpx.ConnectError("the server is restarting")

    monkeypatch.setattr(spec_engine._client, "get", down)
    assert spec_engine.counters() == before
