"""Paging on vLLM's CPU build (the `vllm` lane; issue 39 item 3): a server whose KV pool is far
smaller than what its requests hold together preempts and recomputes, and every request still
completes with the tokens and log-probs it gets alone.

One server for the module, started the way the vllm engine starts it (`VLLMServer`) on the embedded
base's architecture (preset tiny, as tests/engine/test_engine_vllm.py), with `engine.vllm.extra_args`
`--num-gpu-blocks-override 5`: 5 blocks of 128 tokens, one of them vLLM's reserved null block, so
512 tokens hold sequences (`max_model_len` 512: vLLM refuses to start when one sequence of that
length would not fit). Eight requests of a 64-token prompt and 320 tokens each (`ignore_eos`, so
every one grows to 384 tokens: three blocks, which fit alone) hold 3,072 tokens together, six
times the pool: sent at once, the scheduler admits what the pool takes, and each time a running
sequence needs a block that is not free it preempts the newest running request (freeing its
blocks) and later recomputes it from its prompt and the tokens it had. Half the requests are
greedy, half sampled at temperature 1 with their own seeds, as posttrain sends them.

What fails here: a request that does not complete, tokens or log-probs that differ from the same
request run alone (no preemption then; measured |dlogprob| 0), and a batch that caused no
preemption (`vllm:num_preemptions_total` of the server's /metrics): with vLLM's default pool
(engine.vllm.cpu_kv_cache_gib 1: 4,096 blocks here) the same batch is preempted 0 times, so this
assertion is what tells the paging path was taken (bench/RESULTS.md, "vLLM paging").
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from posttrain.configs.engine import VLLMConfig
from posttrain.engine.openai import completion_body
from posttrain.engine.vllm import BASE_NAME, VLLMServer, default_python
from posttrain.types import GenerationRequest, SamplingParams

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not default_python().exists(), reason="no .venv-vllm (make vllm-venv)"),
]

BLOCK_TOKENS = 128
"""Tokens per KV block of vLLM's CPU build."""
POOL_BLOCKS = 5
"""The pool: --num-gpu-blocks-override (the null block and 4 that hold sequences)."""
MAX_LEN = 512
PROMPT_TOKENS, MAX_TOKENS, REQUESTS = 64, 320, 8
TOL = 1e-4
"""|dlogprob| allowed between a request run in the paged batch and alone (fp32; measured 0)."""


@pytest.fixture(scope="module")
def server(tiny_base, tmp_path_factory):
    extra = ("--num-gpu-blocks-override", str(POOL_BLOCKS), "--max-num-seqs", str(REQUESTS))
    srv = VLLMServer(tiny_base, tmp_path_factory.mktemp("run"), VLLMConfig(max_model_len=MAX_LEN, extra_args=extra))
    with srv:
        yield srv


def _bodies() -> list[dict[str, Any]]:
    """The batch: seeded prompts of ordinary token ids; even requests greedy, odd ones sampled."""
    rng = random.Random(0)
    bodies = []
    for i in range(REQUESTS):
        prompt = tuple(rng.randrange(4, 100) for _ in range(PROMPT_TOKENS))
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=float(i % 2), seed=100 + i)
        bodies.append({**completion_body(BASE_NAME, GenerationRequest(prompt, params)), "ignore_eos": True})
    return bodies


def _run(server: VLLMServer, bodies: list[dict[str, Any]], at_once: bool) -> list[tuple[list[int], list[float]]]:
    """Each body's (token ids, log-probs), sent all at once or one after another."""
    with server.client(300.0, REQUESTS + 2) as c:

        def one(body: dict[str, Any]) -> tuple[list[int], list[float]]:
            choice = c.post(server.url + "/v1/completions", json=body).raise_for_status().json()["choices"][0]
            return choice["token_ids"], choice["logprobs"]["token_logprobs"]

        if not at_once:
            return [one(b) for b in bodies]
        with ThreadPoolExecutor(len(bodies)) as pool:
            return list(pool.map(one, bodies))


def test_the_pool_is_the_override(server):
    assert server.kv_cache_tokens() == POOL_BLOCKS * BLOCK_TOKENS  # vLLM's CPU build honours the override
    held = REQUESTS * (PROMPT_TOKENS + MAX_TOKENS)
    usable = (POOL_BLOCKS - 1) * BLOCK_TOKENS
    assert PROMPT_TOKENS + MAX_TOKENS <= MAX_LEN <= usable < held / 4  # each fits alone; all, 6x the pool


def test_requests_past_the_pool_are_preempted_and_complete_unchanged(server):
    bodies = _bodies()
    before = server.metric("vllm:num_preemptions_total")
    paged = _run(server, bodies, at_once=True)
    preempted = server.metric("vllm:num_preemptions_total") - before
    alone = _run(server, bodies, at_once=False)
    print(f"\npaging: {REQUESTS} requests x {PROMPT_TOKENS + MAX_TOKENS} tokens against a pool of "
          f"{(POOL_BLOCKS - 1) * BLOCK_TOKENS}: {preempted:.0f} preemptions")  # fmt: skip

    assert preempted > 0  # the pool forced the scheduler to page
    assert server.metric("vllm:num_preemptions_total") - before == preempted  # alone, each fits: none
    assert [len(ids) for ids, _ in paged] == [MAX_TOKENS] * REQUESTS
    assert [ids for ids, _ in paged] == [ids for ids, _ in alone]
    for (_, lp_paged), (_, lp_alone) in zip(paged, alone):
        assert max(abs(a - b) for a, b in zip(lp_paged, lp_alone)) <= TOL
