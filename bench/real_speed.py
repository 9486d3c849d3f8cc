"""Speed against the machine's limit on the real model (issue 37 item 5): SmolLM2-135M-Instruct's
generation and train-step throughput as fractions of this CPU's measured fp32 matmul peak,
side by side in one run, peak RSS beside each figure.

Every measurement runs in a child process of its own (so its peak RSS, the child's VmHWM, is its
own), with OMP_NUM_THREADS and torch threads = --threads (default 2, this machine's cores):
  - peak: the best of --peak-repeats fp32 `torch.matmul` of two n x n matrices (n = --peak-n,
    2,048), 2 n^3 FLOP each: the GFLOP/s every float32 row is a fraction of; peak-bf16, the same
    in bfloat16 (on a CPU with AVX512-BF16 or AMX, oneDNN's bf16 kernels): the bf16 rows' 100%;
  - generation at batch 1 (one prompt, one sample) and at the RL batch (configs/real.yaml:
    --prompts prompts x --group samples each = 16 rows), every row exactly --max-tokens tokens
    (EOS ignored), T = 1, seeded; the prompt is an arith_fmt training task in the model's chat
    template (level 2; the RL batch, tasks 0-3). One warm-up call (8 tokens), then --repeats
    timed calls; the best is reported (wall seconds) with the range:
      hf       posttrain's in-process engine (engine/hf.py, as the loop builds it: prefix sharing
               on; EOS ignored by emptying the engine's EOS set in the child);
      hf-bf16  the same engine generating with its bf16 copy (engine.generate_dtype bfloat16,
               engine/copy.py), as a fraction of the bf16 peak;
      generate transformers `model.generate` (do_sample, top_k=0, min_new_tokens = max_new_tokens,
               num_return_sequences = group, left-padded prompts);
      vllm     posttrain's vllm engine (engine/vllm.py) over its own vLLM CPU server (.venv-vllm;
               `ignore_eos` added to every request body; the server's worker bound to the same
               cores: VLLM_CPU_OMP_THREADS_BIND=0-(threads-1)); its peak RSS is the sampled peak
               of the server's process tree plus the child's own;
  - train step (train-lora-bf16: the same under trainer.precision bf16_autocast, a fraction of
    the bf16 peak): `Trainer.step` (forward, backward, AdamW) of posttrain's trainer on an RL-shaped
    batch: --prompts groups of --group rows, each row the chat prompt of an arith_fmt task and a
    completion of --completion-tokens random token ids (about 250 tokens a row), rewards 0/1 so
    every group carries signal; LoRA (rank 16, alpha 32, every projection: configs/real.yaml) and
    full fine-tuning. One warm-up step on 2 rows, then --train-repeats timed steps.

FLOP formulas (model shape from its config; N_body = parameters less the embedding matrix, which
is tied to the LM head: the lookup costs nothing, the head 2 x vocab x d per token it scores;
attention 4 x layers x (heads x head_dim) x (position + 1) per token, QK^T and AV):
  forward(tokens) = sum over tokens [2 N_body + 4 L d_attn (pos + 1)] + 2 N_head x scored tokens
  generation call = forward(each distinct prompt once, head on its last token)
                    + forward(every generated token at its position, head on each)
  full step       = 3 x forward(each distinct prompt once + each row's completion inputs,
                    head on the loss tokens)   (backward = 2 x forward; ~ 6 N per token)
  LoRA step       = 2 x forward(the same) + 6 N_lora x forwarded tokens
                    (backward through frozen weights needs activation gradients only, ~ 4 N per
                    token, plus the adapters' own forward, backward and update)
tokens/s counts generated tokens (generation) and sequence tokens, prompt + completion of every
row (train step); the fraction is achieved FLOP/s over the peak.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/real_speed.py --threads 2 > log
    .venv/bin/python bench/real_speed.py --only peak hf-1 --repeats 1      (a quick check)

    .venv/bin/python bench/real_speed.py --only peak hf-vs-generate peak --max-tokens 64 --repeats 3
        (the hf engine and `generate` taking turns in one process: their CPU-time ratio)

Needs the cached model (`posttrain models get smollm2-135m-instruct`) and, for the vllm rows,
.venv-vllm (`make vllm-venv`; from a worktree without one, POSTTRAIN_VLLM_PYTHON names its
interpreter); a measurement that cannot run says why in its row.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MODEL = "smollm2-135m-instruct"
MEASUREMENTS = (
    "peak",
    "peak-bf16",
    "hf-1",
    "hf-rl",
    "hf-bf16-1",
    "hf-bf16-rl",
    "generate-1",
    "generate-rl",
    "vllm",
    "train-lora",
    "train-lora-bf16",
    "train-full",
)
"""Child measurements in run order (`vllm` measures batch 1 and the RL batch on one server)."""
EXTRA = ("hf-vs-generate",)
"""Measurements run only when named in --only: `hf-vs-generate`, the hf engine and transformers
`generate` at the RL batch in one process, taking turns (--repeats rounds after one warm-up
each), in process CPU seconds: their ratio free of the load moving between two children."""


# -- FLOP formulas (pure: tested in tests/bench/test_real_speed.py) --------------


@dataclass(frozen=True)
class Shape:
    """What the FLOP formulas need of a decoder-only model."""

    params: int
    vocab: int
    hidden: int
    layers: int
    attn_width: int
    """Query heads x head dim (the width of QK^T and AV)."""
    tied: bool = True

    @property
    def head(self) -> int:
        """Parameters of the LM head (= the embedding matrix when tied)."""
        return self.vocab * self.hidden

    @property
    def body(self) -> int:
        """Parameters every forwarded token multiplies: all but the embedding (and an untied head)."""
        return self.params - self.head * (1 if self.tied else 2)

    @classmethod
    def of(cls, config: Any, params: int) -> Shape:
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        return cls(
            params=params,
            vocab=int(config.vocab_size),
            hidden=int(config.hidden_size),
            layers=int(config.num_hidden_layers),
            attn_width=heads * head_dim,
            tied=bool(getattr(config, "tie_word_embeddings", False)),
        )


def forward_flops(shape: Shape, start: int, count: int, scored: int) -> float:
    """FLOP of one forward of `count` consecutive tokens at positions start..start+count-1 of one
    sequence (each attending to itself and every earlier position), `scored` of them through
    the LM head."""
    if count <= 0:
        return 2.0 * shape.head * scored
    positions = count * (2 * start + count + 1) / 2  # sum of (pos + 1)
    return 2.0 * shape.body * count + 4.0 * shape.layers * shape.attn_width * positions + 2.0 * shape.head * scored


def generation_flops(shape: Shape, prompt_lens: list[int], samples: int, new_tokens: int) -> float:
    """FLOP of one generation call: each prompt forwarded once (the head on its last token),
    then `samples` rows per prompt, each of `new_tokens` tokens forwarded at its position."""
    flops = 0.0
    for p in prompt_lens:
        flops += forward_flops(shape, 0, p, 1)
        flops += samples * forward_flops(shape, p, new_tokens, new_tokens)
    return flops


def train_forward_flops(shape: Shape, prompt_lens: list[int], group: int, completion: int) -> float:
    """FLOP of the trainer's forward over an RL batch: each distinct prompt forwarded once, each
    row's completion inputs (all but its last token) at their positions; the head scores every
    completion token (the prompt's last position scores the first)."""
    flops = 0.0
    for p in prompt_lens:
        flops += forward_flops(shape, 0, p, 0)
        flops += group * forward_flops(shape, p, completion - 1, completion)
    return flops


def train_step_flops(
    shape: Shape, prompt_lens: list[int], group: int, completion: int, lora_params: int | None
) -> float:
    """FLOP of one train step: full fine-tuning 3 x forward; LoRA (`lora_params` adapter
    parameters) 2 x forward + 6 x lora_params per forwarded token."""
    fwd = train_forward_flops(shape, prompt_lens, group, completion)
    if lora_params is None:
        return 3.0 * fwd
    forwarded = sum(prompt_lens) + group * len(prompt_lens) * (completion - 1)
    return 2.0 * fwd + 6.0 * lora_params * forwarded


def matmul_flops(n: int) -> float:
    """FLOP of an n x n by n x n matmul."""
    return 2.0 * n**3


@dataclass
class Row:
    """One line of the table."""

    name: str
    batch: str
    tokens_per_s: float | None = None
    range_: str = ""
    gflops: float | None = None
    peak_rss_mb: float | None = None
    note: str = ""
    peak_of: str = "fp32"
    """Which measured peak the row's GFLOP/s is a fraction of: fp32, or bf16 (a bf16 row's own)."""


def fraction(gflops: float | None, peak: float | None) -> str:
    """`gflops` as a percentage of `peak` ("" when either is unknown)."""
    if gflops is None or not peak:
        return ""
    return f"{100.0 * gflops / peak:.1f}%"


def table(rows: list[Row], peak: float | None, peaks: dict[str, float | None] | None = None) -> str:
    """The Markdown table of `rows`: each row's GFLOP/s as a fraction of its own dtype's peak
    (`peaks` by `Row.peak_of`; `peak`, the fp32 peak, where `peaks` does not name it)."""
    peaks = {"fp32": peak, **(peaks or {})}
    out = [
        "| measurement | batch | tokens/s (best; range) | GFLOP/s | of peak | peak RSS MiB | note |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        tps = "" if r.tokens_per_s is None else f"{r.tokens_per_s:,.1f}" + (f" ({r.range_})" if r.range_ else "")
        gf = "" if r.gflops is None else f"{r.gflops:,.1f}"
        rss = "" if r.peak_rss_mb is None else f"{r.peak_rss_mb:,.0f}"
        out.append(
            f"| {r.name} | {r.batch} | {tps} | {gf} | {fraction(r.gflops, peaks.get(r.peak_of))} | {rss} | {r.note} |"
        )
    return "\n".join(out)


def rate_range(tokens: int, seconds: list[float]) -> tuple[float, str]:
    """(best tokens/s, "min-max" tokens/s) of equal-sized timed calls."""
    rates = sorted(tokens / s for s in seconds)
    return rates[-1], f"{rates[0]:,.1f}-{rates[-1]:,.1f}" if len(rates) > 1 else ""


# -- children ---------------------------------------------------------------------


def vm_hwm_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _setup(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)


def _prompts(encode: Any, count: int) -> list[tuple[int, ...]]:
    """The chat-template ids of arith_fmt training tasks 0..count-1 at level 2."""
    from posttrain.domains.registry import get

    domain = get("arith_fmt")
    return [tuple(encode(domain.sample(i, "train", 2).prompt)) for i in range(count)]


def _load(args: argparse.Namespace) -> tuple[Any, Any, Shape]:
    from posttrain.model.arch import load_model

    model, tok = load_model(args.model, device="cpu")
    return model, tok, Shape.of(model.config, sum(p.numel() for p in model.parameters()))


def child_peak(args: argparse.Namespace, dtype: str = "float32") -> dict[str, Any]:
    import torch

    n = args.peak_n
    g = torch.Generator().manual_seed(0)
    kind = getattr(torch, dtype)
    a, b = torch.randn(n, n, generator=g).to(kind), torch.randn(n, n, generator=g).to(kind)
    torch.matmul(a, b)  # warm-up
    times = []
    for _ in range(args.peak_repeats):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        times.append(time.perf_counter() - t0)
    best = min(times)
    return {"gflops": matmul_flops(n) / best / 1e9, "seconds": times}


def _gen_shape(args: argparse.Namespace, which: str) -> tuple[int, int]:
    """(prompts, samples per prompt) of a generation measurement."""
    return (1, 1) if which == "1" else (args.prompts, args.group)


def child_hf(args: argparse.Namespace, which: str, generate_dtype: str = "model") -> dict[str, Any]:
    from posttrain.engine.hf import HFEngine, HFEngineConfig
    from posttrain.types import GenerationRequest, SamplingParams

    model, tok, shape = _load(args)
    engine = HFEngine(model, tok, config=HFEngineConfig(generate_dtype=generate_dtype), seed=0)
    engine._eos_ids = frozenset()  # every row makes exactly max_tokens tokens
    n_prompts, group = _gen_shape(args, which)
    prompts = _prompts(engine.encode_chat, n_prompts)

    def reqs(max_tokens: int) -> list[Any]:
        return [
            GenerationRequest(p, SamplingParams(max_tokens=max_tokens, temperature=1.0, n=group, seed=100 + i))
            for i, p in enumerate(prompts)
        ]

    engine.generate(reqs(8))
    times, cpu, tokens = [], [], 0
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        out = engine.generate(reqs(args.max_tokens))
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        tokens = sum(len(c.token_ids) for g in out for c in g)
    return _gen_result(shape, prompts, group, args.max_tokens, tokens, times, cpu)


def _gen_result(
    shape: Shape,
    prompts: list[tuple[int, ...]],
    group: int,
    new: int,
    tokens: int,
    times: list[float],
    cpu: list[float] | None = None,
) -> dict[str, Any]:
    expected = len(prompts) * group * new
    best, span = rate_range(tokens, times)
    flops = generation_flops(shape, [len(p) for p in prompts], group, new)
    return {
        "tokens": tokens,
        "expected_tokens": expected,
        "seconds": times,
        "tokens_per_s": best,
        "range": span,
        "gflops": flops / min(times) / 1e9,
        "prompt_lens": [len(p) for p in prompts],
        "cpu_seconds": cpu or [],
        "tokens_per_cpu_s": tokens / min(cpu) if cpu else None,
    }


def child_generate(args: argparse.Namespace, which: str) -> dict[str, Any]:
    import torch

    from posttrain.engine.base import chat_ids

    model, tok, shape = _load(args)
    model.eval()
    n_prompts, group = _gen_shape(args, which)
    prompts = _prompts(lambda m: chat_ids(tok, m), n_prompts)
    width = max(map(len, prompts))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])

    def call(new: int) -> Any:
        torch.manual_seed(0)
        with torch.inference_mode():
            return model.generate(
                ids,
                attention_mask=mask,
                do_sample=True,
                top_k=0,
                temperature=1.0,
                max_new_tokens=new,
                min_new_tokens=new,
                num_return_sequences=group,
                pad_token_id=pad,
            )

    call(8)
    times, cpu, tokens = [], [], 0
    for _ in range(args.repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        out = call(args.max_tokens)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        tokens = int(out[:, width:].numel())
    return _gen_result(shape, prompts, group, args.max_tokens, tokens, times, cpu)


def child_vllm(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    from engines import TreeRSS  # bench/engines.py: the server's process-tree RSS sampler

    import posttrain.engine.vllm as vllm_mod
    from posttrain.configs.engine import VLLMConfig
    from posttrain.engine.base import chat_ids
    from posttrain.engine.vllm import VLLMEngine, VLLMServer, default_python
    from posttrain.model.arch import load_tokenizer
    from posttrain.model.real import resolve
    from posttrain.types import GenerationRequest, SamplingParams

    if not default_python().exists():
        return {"error": f"no vLLM venv at {default_python()} (make vllm-venv)"}
    inner = vllm_mod.completion_body

    def body(*a: Any, **k: Any) -> dict[str, Any]:
        out = inner(*a, **k)
        out["ignore_eos"] = True  # vLLM's extension: every row makes exactly max_tokens tokens
        return out

    vllm_mod.completion_body = body  # type: ignore[assignment]
    model_dir = resolve(args.model)
    tok = load_tokenizer(model_dir)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    from safetensors import safe_open

    with safe_open(str(Path(model_dir) / "model.safetensors"), "pt") as f:
        params = sum(_prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118 - a safe_open is not iterable
    shape = Shape.of(config, params)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="real-speed-vllm-") as work:
        server = VLLMServer(model_dir, work, VLLMConfig(max_model_len=args.vllm_max_len))
        t0 = time.perf_counter()
        try:
            server.start()
        except Exception as exc:  # noqa: BLE001 - reported in the table's row
            return {"error": f"the vLLM server did not start: {str(exc)[-600:]}"}
        assert server.proc is not None
        rss = TreeRSS(server.proc.pid)
        try:
            engine = VLLMEngine(tok, server=server, seed=0, timeout_s=900, push_retries=0)
            results["startup_s"] = time.perf_counter() - t0
            for which in ("1", "rl"):
                n_prompts, group = _gen_shape(args, which)
                prompts = _prompts(lambda m: chat_ids(tok, m), n_prompts)

                def reqs(new: int, prompts: list[tuple[int, ...]] = prompts, group: int = group) -> list[Any]:
                    return [
                        GenerationRequest(p, SamplingParams(max_tokens=new, temperature=1.0, n=group, seed=100 + i))
                        for i, p in enumerate(prompts)
                    ]

                engine.generate(reqs(8))
                times, tokens = [], 0
                for _ in range(args.repeats):
                    t1 = time.perf_counter()
                    out = engine.generate(reqs(args.max_tokens))
                    times.append(time.perf_counter() - t1)
                    tokens = sum(len(c.token_ids) for g in out for c in g)
                results[which] = _gen_result(shape, prompts, group, args.max_tokens, tokens, times)
            log = server.log_path.read_text(errors="replace")
            keys = ("core ids=", "reserved_cpus", "OMP threads")
            results["omp_binding"] = [
                ln.split("]", 1)[-1].strip() for ln in log.splitlines() if any(k in ln for k in keys)
            ][:4]  # noqa: E501
        finally:
            mem = rss.stop()
            server.stop()
    results["server_peak_rss_mb"] = mem["peak_rss_mb"]
    return results


def _prod(xs: Any) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def child_train(args: argparse.Namespace, kind: str, precision: str = "float32") -> dict[str, Any]:
    import random

    from posttrain.configs.trainer import LoraConfig, TrainerConfig
    from posttrain.engine.base import chat_ids
    from posttrain.trainer.batch import TrainBatch, TrainRow
    from posttrain.trainer.trainer import Trainer

    model, tok, shape = _load(args)
    lora = LoraConfig(rank=args.lora_rank, alpha=2.0 * args.lora_rank) if kind == "lora" else None
    trainer = Trainer(model, TrainerConfig(lr=1e-6, lora=lora, precision=precision))
    lora_params = sum(p.numel() for p in trainer.params) if lora is not None else None
    prompts = _prompts(lambda m: chat_ids(tok, m), args.prompts)
    rng = random.Random(0)
    c = args.completion_tokens
    rows = []
    for g, p in enumerate(prompts):
        for k in range(args.group):
            comp = tuple(rng.randrange(100, shape.vocab) for _ in range(c))
            rows.append(TrainRow(p, comp, tuple(-8.0 for _ in comp), float(k % 2), g, (1,) * c))
    batch = TrainBatch(tuple(rows))
    trainer.step(TrainBatch(tuple(rows[:2])))  # warm-up
    times, cpu = [], []
    for _ in range(args.train_repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        trainer.step(batch)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rows)
    best, span = rate_range(tokens, times)
    flops = train_step_flops(shape, [len(p) for p in prompts], args.group, c, lora_params)
    return {
        "tokens": tokens,
        "seconds": times,
        "tokens_per_s": best,
        "range": span,
        "gflops": flops / min(times) / 1e9,
        "trainable": sum(p.numel() for p in trainer.params),
        "prompt_lens": [len(p) for p in prompts],
        "shared_prompts": bool(trainer._share_prompts),
        "cpu_seconds": cpu,
        "tokens_per_cpu_s": tokens / min(cpu),
    }


def child_hf_vs_generate(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from posttrain.engine.hf import HFEngine
    from posttrain.types import GenerationRequest, SamplingParams

    model, tok, shape = _load(args)
    model.eval()
    engine = HFEngine(model, tok, seed=0)
    engine._eos_ids = frozenset()
    prompts = _prompts(engine.encode_chat, args.prompts)
    new, group = args.max_tokens, args.group
    reqs = [
        GenerationRequest(p, SamplingParams(max_tokens=new, temperature=1.0, n=group, seed=100 + i))
        for i, p in enumerate(prompts)
    ]
    width = max(map(len, prompts))
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])

    def generate() -> Any:
        with torch.inference_mode():
            return model.generate(ids, attention_mask=mask, do_sample=True, top_k=0, max_new_tokens=new,
                                  min_new_tokens=new, num_return_sequences=group, pad_token_id=pad)  # fmt: skip

    calls = {"generate": generate, "hf": lambda: engine.generate(reqs)}
    for fn in calls.values():
        fn()  # warm-up
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    wall: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.repeats):
        for name, fn in calls.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    tokens = len(prompts) * group * new
    flops = generation_flops(shape, [len(p) for p in prompts], group, new)
    return {
        name: {
            "tokens": tokens,
            "expected_tokens": tokens,
            "seconds": wall[name],
            "cpu_seconds": cpu[name],
            "tokens_per_s": tokens / min(wall[name]),
            "range": rate_range(tokens, wall[name])[1],
            "tokens_per_cpu_s": tokens / min(cpu[name]),
            "gflops": flops / min(wall[name]) / 1e9,
        }
        for name in calls
    }


def child(args: argparse.Namespace) -> None:
    _setup(args)
    name = args.child
    if name == "peak":
        out = child_peak(args)
    elif name == "peak-bf16":
        out = child_peak(args, "bfloat16")
    elif name == "hf-vs-generate":
        out = child_hf_vs_generate(args)
    elif name in ("hf-1", "hf-rl"):
        out = child_hf(args, name.split("-", 1)[1])
    elif name in ("hf-bf16-1", "hf-bf16-rl"):
        out = child_hf(args, name.rsplit("-", 1)[1], "bfloat16")
    elif name.startswith("generate-"):
        out = child_generate(args, name.split("-", 1)[1])
    elif name == "vllm":
        out = child_vllm(args)
    elif name == "train-lora-bf16":
        out = child_train(args, "lora", "bf16_autocast")
    elif name.startswith("train-"):
        out = child_train(args, name.split("-", 1)[1])
    else:
        raise SystemExit(f"unknown measurement {name!r}; known: {', '.join(MEASUREMENTS + EXTRA)}")
    out["vm_hwm_mb"] = vm_hwm_mb()
    print("RESULT " + json.dumps(out))


# -- the parent -------------------------------------------------------------------


def run_child(args: argparse.Namespace, name: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", name]
    for key in ("model", "threads", "repeats", "max_tokens", "prompts", "group", "completion_tokens", "lora_rank"):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    cmd += ["--train-repeats", str(args.train_repeats), "--peak-n", str(args.peak_n)]
    cmd += ["--peak-repeats", str(args.peak_repeats), "--vllm-max-len", str(args.vllm_max_len)]
    cores = ",".join(str(i) for i in range(args.threads)) if args.threads > 1 else "0"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(args.threads),
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.threads - 1}" if args.threads > 1 else cores,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
    }
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.child_timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.child_timeout} s"}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        return {"error": f"exit {out.returncode}: {out.stderr.strip()[-600:]}"}
    return json.loads(lines[-1][len("RESULT ") :])


def rows_of(name: str, res: dict[str, Any], args: argparse.Namespace) -> list[Row]:
    """The table rows of one measurement's result."""
    rl = f"{args.prompts} x {args.group}"
    labels = {
        "hf-1": ("hf engine", "1"),
        "hf-rl": ("hf engine", rl),
        "hf-bf16-1": ("hf engine, bf16 copy (engine.generate_dtype)", "1"),
        "hf-bf16-rl": ("hf engine, bf16 copy (engine.generate_dtype)", rl),
        "generate-1": ("transformers generate", "1"),
        "generate-rl": ("transformers generate", rl),
        "train-lora": (f"train step, LoRA r={args.lora_rank}", rl),
        "train-lora-bf16": (f"train step, LoRA r={args.lora_rank}, bf16 autocast", rl),
        "train-full": ("train step, full", rl),
    }
    if "error" in res:
        label, batch = labels.get(name, (name, ""))
        return [Row(label, batch, note=res["error"].replace("\n", " ").replace("|", "/"))]
    rss = res.get("vm_hwm_mb")
    if name in ("peak", "peak-bf16"):
        kind = "bf16" if name == "peak-bf16" else "fp32"
        note = f"{kind} matmul {args.peak_n}^3, best of {args.peak_repeats}"
        return [Row(f"matmul peak, {kind}", "", gflops=res["gflops"], peak_rss_mb=rss, note=note, peak_of=kind)]
    if name == "hf-vs-generate":
        pair = [
            Row(
                label,
                rl,
                r["tokens_per_s"],
                r["range"],
                r["gflops"],
                rss,
                f"taking turns; {r['tokens_per_cpu_s']:,.1f} tokens/CPU-s",
            )  # fmt: skip
            for label, r in (("hf engine (turns)", res["hf"]), ("transformers generate (turns)", res["generate"]))
        ]
        ratio = res["hf"]["tokens_per_cpu_s"] / res["generate"]["tokens_per_cpu_s"]
        pair[0].note += f" = {ratio:.2f}x generate's"
        return pair
    if name == "vllm":
        server = res.get("server_peak_rss_mb", 0.0)
        out = []
        for which, batch in (("1", "1"), ("rl", rl)):
            r = res[which]
            note = f"start-up {res['startup_s']:.0f} s; RSS = server tree {server:,.0f} + client {rss:,.0f}"
            out.append(Row("vllm engine (CPU build)", batch, r["tokens_per_s"], r["range"], r["gflops"],
                           server + (rss or 0.0), note))  # fmt: skip
        return out
    label, batch = labels[name]
    if name.startswith("train-"):
        note = f"{res['tokens']} tokens a step, {res['trainable'] / 1e6:.2f}M trainable"
    else:
        note = f"{res['tokens']} tokens a call"
        if res["tokens"] != res["expected_tokens"]:
            note += f" (expected {res['expected_tokens']})"
    if res.get("tokens_per_cpu_s"):  # process CPU: steadier than wall on a shared machine
        note += f"; {res['tokens_per_cpu_s']:,.1f} tokens/CPU-s"
    kind = "bf16" if "-bf16" in name else "fp32"
    return [Row(label, batch, res["tokens_per_s"], res["range"], res["gflops"], rss, note, peak_of=kind)]


def progress(row: Row) -> str:
    """One row's figures for the progress line (its note when it has none)."""
    if row.gflops is None:
        return row.note
    tokens = "" if row.tokens_per_s is None else f"{row.tokens_per_s:,.1f} tok/s, "
    return f"{row.batch or row.name}: {tokens}{row.gflops:,.1f} GFLOP/s, {row.peak_rss_mb or 0:,.0f} MiB"


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="timed generation calls per measurement")
    ap.add_argument("--train-repeats", type=int, default=2, help="timed train steps per measurement")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=4, help="prompts of the RL batch (rollout.prompts_per_step)")
    ap.add_argument("--group", type=int, default=4, help="samples per prompt (rollout.group_size)")
    ap.add_argument("--completion-tokens", type=int, default=180, help="completion tokens per train row")
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--peak-n", type=int, default=2048)
    ap.add_argument("--peak-repeats", type=int, default=5)
    ap.add_argument("--vllm-max-len", type=int, default=2048, help="the vLLM server's max_model_len")
    ap.add_argument("--child-timeout", type=int, default=900)
    ap.add_argument("--only", nargs="+", default=list(MEASUREMENTS), choices=MEASUREMENTS + EXTRA)
    ap.add_argument("--json", default="", help="also write every child's raw result here")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # the children inherit it (set here: no import side effect)
    if args.child:
        child(args)
        return 0
    print(
        f"{args.model}, {args.threads} threads; generation: {args.max_tokens} tokens a row (EOS ignored), T = 1, "
        f"best of {args.repeats} after a warm-up; train: {args.prompts} x {args.group} rows of prompt + "
        f"{args.completion_tokens} tokens, best of {args.train_repeats} after a warm-up",
        flush=True,
    )
    results: dict[str, Any] = {}
    rows: list[Row] = []
    t_all = time.perf_counter()
    for i, name in enumerate(args.only):
        load0, t0 = load_average(), time.perf_counter()
        print(f"[{i + 1}/{len(args.only)}] {name} ... (load {load0})", flush=True)
        res = results[name] = run_child(args, name)
        res["load_before"], res["load_after"] = load0, load_average()
        got = rows_of(name, res, args)
        rows += got
        shown = "; ".join(progress(r) for r in got)
        print(f"[{i + 1}/{len(args.only)}] {name}: {shown} ({time.perf_counter() - t0:.0f} s, load {load_average()})",
              flush=True)  # fmt: skip
    peak = results.get("peak", {}).get("gflops")
    print(f"\nall measurements: {time.perf_counter() - t_all:.0f} s wall\n")
    print(table(rows, peak, {"bf16": results.get("peak-bf16", {}).get("gflops")}))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results,
                                               "rows": [asdict(r) for r in rows]}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
