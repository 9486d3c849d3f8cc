"""An export loads in vLLM, outside posttrain's code, with posttrain's ids and greedy answers
(the `vllm` lane: `make test-vllm`).

One subprocess of .venv-vllm's python runs vLLM's offline API (`vllm.LLM`, fp32, eager, the
CPU settings posttrain's own server uses) on a `posttrain export` folder of a short-pretrained
tiny base (vLLM's CPU attention needs head_dim >= 32: the micro preset's 8 is refused), with
tied embeddings as exported, and prints the tokenizer's ids, the ids vLLM itself prompted with,
their logprobs and its greedy completions (stopped at EOS, and through it: `ignore_eos`) for
posttrain's own prompts of every built-in domain but reasoning-gym's.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import torch

from export_check import domain_prompts, export_base
from posttrain.engine.vllm import default_python
from posttrain.model.arch import load_model
from posttrain.model.tokenizer import build_tokenizer

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not default_python().exists(), reason="no .venv-vllm (make vllm-venv)"),
]

NEW = 8
"""Greedy tokens per prompt."""
TOL = 1e-4
"""|dlogprob| allowed on every prompt token between vLLM and posttrain (fp32 both), as in
test_engine_vllm.py."""

# vLLM only: posttrain is not importable from this script's path.
VLLM = r"""
import json, sys
sys.path = [p for p in sys.path if "posttrain" not in p and not p.endswith("src")]
from vllm import LLM, SamplingParams
folder, new, length = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
prompts = json.loads(sys.stdin.read())
llm = LLM(model=folder, dtype="float32", enforce_eager=True, max_model_len=length, seed=0,
          enable_chunked_prefill=False, max_num_batched_tokens=max(length, 2048))
tok = llm.get_tokenizer()
outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=new, prompt_logprobs=0))
full = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=new, ignore_eos=True))
assert "posttrain" not in sys.modules
print("JSON " + json.dumps({
    "class": type(tok).__name__,
    "ids": [tok.encode(p) for p in prompts],
    "prompt_ids": [list(o.prompt_token_ids) for o in outs],
    "greedy_ids": [list(o.outputs[0].token_ids) for o in outs],
    "greedy": [o.outputs[0].text for o in outs],
    "full_ids": [list(o.outputs[0].token_ids) for o in full],
    "full": [o.outputs[0].text for o in full],
    "prompt_logprobs": [[d[t].logprob for d, t in zip(o.prompt_logprobs[1:], o.prompt_token_ids[1:])] for o in outs],
}))
"""


def _vllm(folder, prompts: list[str], new: int, length: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env |= {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}  # as VLLMServer.env sets them
    proc = subprocess.run(
        [str(default_python()), "-c", VLLM, str(folder), str(new), str(length)],
        input=json.dumps(prompts),
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in reversed(proc.stdout.splitlines()) if x.startswith("JSON "))
    return json.loads(line[len("JSON ") :])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from posttrain.configs.base import BaseConfig
    from posttrain.model.pretrain import build_base

    tmp = tmp_path_factory.mktemp("export")
    base = build_base(BaseConfig(preset="tiny", steps=30, batch_size=16, threads=1), tmp / "tiny", progress=False)
    return export_base(base, tmp)


def test_vllm_gets_posttrains_ids_and_greedy_answers(exported):
    prompts = ["rev kgb=", "sort 975=", "a b\n\tc"] + domain_prompts()
    config = json.loads((exported / "config.json").read_text())
    out = _vllm(exported, prompts, NEW, int(config["max_position_embeddings"]))
    assert len(out["ids"][0]) == 8
    _assert_matches(exported, prompts, out, NEW)


def _assert_matches(folder, prompts: list[str], out: dict, new: int) -> None:
    """vLLM's ids (its tokenizer's and those it prompted with) equal posttrain's tokenizer's, its
    logprob of every prompt token posttrain's model's within TOL, and its greedy ids and texts
    (`new` tokens through EOS, and stopped at EOS) posttrain's model's, prompt by prompt. Greedy
    alone is weak on a short-pretrained base: most of its answers are EOS at once."""
    model, tok = load_model(folder)
    built = build_tokenizer()
    rows = zip(
        prompts,
        out["ids"],
        out["prompt_ids"],
        out["greedy_ids"],
        out["greedy"],
        out["full_ids"],
        out["full"],
        out["prompt_logprobs"],
        strict=True,
    )
    for p, ids, prompted, got_ids, answer, full_ids, full, logprobs in rows:
        assert ids == prompted == tok.encode(p) == built.encode(p), p
        with torch.no_grad():
            mine = model(torch.tensor([ids])).logits[0, :-1].log_softmax(-1).gather(1, torch.tensor([ids[1:]]).T)
        assert torch.allclose(torch.tensor(logprobs), mine[:, 0], atol=TOL, rtol=0), p
        want = _greedy(model, ids, new)
        assert (full_ids, full) == (want, tok.decode(want, skip_special_tokens=True)), p
        if tok.eos_token_id in want:  # without ignore_eos, vLLM stops at EOS (and returns it)
            want = want[: want.index(tok.eos_token_id) + 1]
        assert (got_ids, answer) == (want, tok.decode(want, skip_special_tokens=True)), p


def _greedy(model, ids: list[int], new: int) -> list[int]:
    """posttrain's model's `new` greedy tokens after `ids`, through EOS (vLLM's ignore_eos): a
    KV-cached argmax loop, as `generate` computes them but without stopping."""
    out, past, x = [], None, torch.tensor([ids])
    with torch.no_grad():
        for _ in range(new):
            step = model(input_ids=x, past_key_values=past, use_cache=True)
            past, token = step.past_key_values, int(step.logits[0, -1].argmax())
            out.append(token)
            x = torch.tensor([[token]])
    return out
