"""The GPU check: a short real run on a randomly initialised Qwen2 of about 0.5B parameters.

No hub: the architecture is Qwen2.5-0.5B's configuration (hidden 896, 24 layers,
14 heads, 2 KV heads, MLP 4864, vocabulary 151,936, tied embeddings), weights random.
It measures, on the one Trainer/HFEngine code path the CPU uses:
  1. generation tokens/s of the hf engine (KV-cached sampling, groups share prompts);
  2. seconds per training step (GRPO, bf16 autocast, gradient checkpointing,
     memory-sized micro-batches) on on-policy rows the engine sampled,
     with a learnable reward (share of completion tokens with id < 1000), and the loss curve;
  3. peak CUDA memory;
  4. a LoRA step (adapters only) and its time;
  5. pinned RNG: two fresh trainers with deterministic=True give bit-identical weights
     (or the error torch raises for an op without a deterministic kernel);
  6. the vllm engine (engine/vllm.py, the path `engine.kind: vllm` takes), when the vLLM venv
     exists (`make vllm-venv`, or $POSTTRAIN_VLLM_PYTHON): a server started by posttrain on a
     random model of --vllm-preset's shape with the embedded tokenizer (vocabulary 104; the
     0.5B body on CUDA, bf16 weights in server and trainer), then generation tokens/s, the
     push latency of a full in-place reload and of a LoRA adapter (each the median of
     --pushes, after one real optimizer step), and the verified-sync gap: max |engine -
     trainer| log-prob over a fixed 320-token-prompt probe (engine/probe.py's check, the one
     every push of a run makes) on identical weights and after a push.
Writes every figure to --out (JSON) and prints a summary. `--preset tiny --device cpu`
runs the same script small on a CPU (to check the script itself); `--device cpu --stages
vllm` runs only stage 6 on the CPU build, --vllm-preset small.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

SHAPES = {  # hidden, layers, heads, kv heads, mlp, vocab
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151936),
    "tiny": (64, 2, 4, 2, 128, 2048),
}
EOS = {"qwen2.5-0.5b": 151643, "tiny": 2047}
VLLM_SHAPES = {  # hidden, layers, heads, kv heads, mlp (the vocabulary is the embedded tokenizer's)
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864),
    "small": (256, 6, 8, 4, 768),
}


class IdTokenizer:
    """What the hf engine needs of a tokenizer, for a model without one: ids as text."""

    def __init__(self, eos: int) -> None:
        self.eos_token_id = eos
        self.pad_token_id = eos
        self.chat_template = None

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return " ".join(str(i) for i in ids)


def build_model(preset: str, device: str, seed: int) -> Any:
    from transformers import AutoModelForCausalLM, Qwen2Config

    hidden, layers, heads, kv, mlp, vocab = SHAPES[preset]
    cfg = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=EOS[preset],
        pad_token_id=EOS[preset],
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).to(device)


def requests(n_prompts: int, group: int, prompt_len: int, max_tokens: int, vocab: int, step: int) -> list[Any]:
    from posttrain.types import GenerationRequest, SamplingParams

    g = torch.Generator().manual_seed(1000 + step)
    out = []
    for i in range(n_prompts):
        prompt = tuple(int(t) for t in torch.randint(0, vocab - 1, (prompt_len,), generator=g))
        out.append(
            GenerationRequest(
                prompt, SamplingParams(max_tokens=max_tokens, temperature=1.0, n=group, seed=step * 100_003 + i)
            )
        )
    return out


def reward(token_ids: tuple[int, ...]) -> float:
    return sum(t < 1000 for t in token_ids) / max(1, len(token_ids))


def to_batch(groups: list[list[Any]]) -> Any:
    from posttrain.trainer.batch import TrainBatch, TrainRow

    rows = [
        TrainRow.from_completion(c, reward(c.token_ids), f"g{i}", 1.0)
        for i, g in enumerate(groups)
        for c in g
        if c.token_ids
    ]
    return TrainBatch(tuple(rows))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_loop(args: argparse.Namespace, device: torch.device, results: dict[str, Any]) -> None:
    from posttrain.configs.trainer import TrainerConfig
    from posttrain.engine.hf import HFEngine
    from posttrain.trainer.memory import peak_memory_bytes
    from posttrain.trainer.trainer import Trainer

    model = build_model(args.preset, str(device), 0)
    results["parameters"] = sum(p.numel() for p in model.parameters())
    cfg = TrainerConfig(
        lr=args.lr,
        precision="bf16_autocast" if device.type == "cuda" else "float32",
        gradient_checkpointing=True,
        micro_batch_size=64,
        micro_batch_tokens="auto",
    )
    trainer = Trainer(model, cfg)
    engine = HFEngine(model, IdTokenizer(EOS[args.preset]), seed=0)
    vocab = SHAPES[args.preset][5]
    curve = []
    for step in range(1, args.steps + 1):
        sync(device)
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            groups = engine.generate(requests(args.prompts, args.group, args.prompt_len, args.max_tokens, vocab, step))
        sync(device)
        gen_s = time.perf_counter() - t0
        tokens = sum(len(c.token_ids) for g in groups for c in g)
        batch = to_batch(groups)
        t1 = time.perf_counter()
        stats = trainer.step(batch)
        sync(device)
        train_s = time.perf_counter() - t1
        engine.update_weights(None)
        mean_r = sum(r.reward for r in batch.rows) / len(batch.rows)
        curve.append(
            {
                "step": step,
                "loss": stats.loss,
                "reward_mean": mean_r,
                "grad_norm": stats.grad_norm,
                "outcome": stats.outcome,
                "gen_tokens": tokens,
                "gen_s": gen_s,
                "gen_tokens_per_s": tokens / gen_s,
                "train_s": train_s,
                "train_tokens": stats.n_tokens,
            }
        )
        print(
            f"step {step:3d} loss {stats.loss:+.3e} reward {mean_r:.4f} grad {stats.grad_norm:.3f} "
            f"gen {tokens / gen_s:9.0f} tok/s train {train_s:6.2f} s ({stats.outcome})",
            flush=True,
        )
    warm = curve[1:] or curve
    results["loop"] = {
        "config": {k: getattr(args, k) for k in ("prompts", "group", "prompt_len", "max_tokens", "lr", "steps")},
        "trainer": cfg.model_dump(mode="json"),
        "micro_batch_tokens_auto": trainer._max_tokens,
        "gen_tokens_per_s": sum(c["gen_tokens"] for c in warm) / sum(c["gen_s"] for c in warm),
        "train_s_per_step": sum(c["train_s"] for c in warm) / len(warm),
        "peak_memory_bytes": peak_memory_bytes(device),
        "curve": curve,
    }
    del trainer, engine, model
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_lora(args: argparse.Namespace, device: torch.device, results: dict[str, Any]) -> None:
    from posttrain.configs.trainer import LoraConfig, TrainerConfig
    from posttrain.engine.hf import HFEngine
    from posttrain.trainer.trainer import Trainer

    model = build_model(args.preset, str(device), 0)
    cfg = TrainerConfig(
        lr=1e-4,
        lora=LoraConfig(rank=16, alpha=32),
        precision="bf16_autocast" if device.type == "cuda" else "float32",
        micro_batch_tokens="auto",
    )
    trainer = Trainer(model, cfg)
    engine = HFEngine(model, IdTokenizer(EOS[args.preset]), seed=0)
    vocab = SHAPES[args.preset][5]
    times = []
    for step in range(1, 4):
        batch = to_batch(
            engine.generate(requests(args.prompts, args.group, args.prompt_len, args.max_tokens, vocab, step))
        )
        sync(device)
        t0 = time.perf_counter()
        stats = trainer.step(batch)
        sync(device)
        times.append(time.perf_counter() - t0)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    results["lora"] = {
        "trainable_parameters": trainable,
        "train_s_per_step": sum(times[1:]) / len(times[1:]),
        "last_outcome": stats.outcome,
    }
    print(
        f"lora r=16: {trainable:,} trainable parameters, {results['lora']['train_s_per_step']:.2f} s/step", flush=True
    )
    del trainer, engine, model
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run_pinned(args: argparse.Namespace, device: torch.device, results: dict[str, Any]) -> None:
    from posttrain.configs.trainer import TrainerConfig
    from posttrain.engine.hf import HFEngine
    from posttrain.trainer.trainer import Trainer

    finals = []
    try:
        for _ in range(2):
            model = build_model(args.preset, str(device), 0)
            batch = to_batch(
                HFEngine(model, IdTokenizer(EOS[args.preset]), seed=0).generate(
                    requests(8, 4, args.prompt_len, 32, SHAPES[args.preset][5], 1)
                )
            )
            trainer = Trainer(
                model,
                TrainerConfig(
                    lr=1e-4, deterministic=True, precision="bf16_autocast" if device.type == "cuda" else "float32"
                ),
            )
            for _ in range(2):
                trainer.step(batch)
            finals.append([p.detach().float().cpu() for p in trainer.model.parameters()])
            del trainer, model
        same = all(torch.equal(a, b) for a, b in zip(*finals))
        results["pinned_rng"] = {"identical": same}
    except Exception as exc:  # noqa: BLE001 - the report records what torch refused
        results["pinned_rng"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    finally:
        torch.use_deterministic_algorithms(False)
    print(f"pinned RNG: {results['pinned_rng']}", flush=True)


def _vllm_model(preset: str, out: Path) -> Path:
    """A random Qwen2 of `preset`'s shape with the embedded tokenizer, saved for vLLM (tied embeddings)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from posttrain.model.tokenizer import build_tokenizer

    tok = build_tokenizer()
    hidden, layers, heads, kv, mlp = VLLM_SHAPES[preset]
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _parity_batch(groups: list[list[Any]]) -> Any:
    """Rows rewarded by the parity of their first token: mixed rewards in a group, so a step
    changes the weights (stage 5's reward is 1 for every token of a 104-token vocabulary)."""
    from posttrain.trainer.batch import TrainBatch, TrainRow

    rows = [
        TrainRow.from_completion(c, float(c.token_ids[0] % 2), f"g{i}", 1.0)
        for i, g in enumerate(groups)
        for c in g
        if c.token_ids
    ]
    return TrainBatch(tuple(rows))


def _probe_gap(engine: Any, trainer: Any, version: int, device: torch.device) -> dict[str, Any]:
    """max |engine - trainer| log-prob on the verified-sync probe: engine/probe.py's SyncProbe.check,
    the check every push of a run makes (320+ prompt tokens, 8 tokens at T = 1); `device` is unused
    (the trainer scores on its own device)."""
    from posttrain.configs.engine import EngineConfig
    from posttrain.engine.probe import SyncProbe

    result = SyncProbe(EngineConfig(kind="vllm", verify_sync="on"), engine, trainer).check(version)
    return {"via": "engine/probe.py", **result.to_dict()}


def run_vllm(args: argparse.Namespace, device: torch.device, results: dict[str, Any]) -> None:
    """The vllm engine end to end: start, generate, one optimizer step, full and LoRA pushes, probe gap."""
    import statistics
    import tempfile

    from posttrain.configs.engine import EngineConfig, VLLMConfig
    from posttrain.configs.trainer import LoraConfig, TrainerConfig
    from posttrain.engine.sync import WeightSync
    from posttrain.engine.vllm import VLLMEngine, default_python
    from posttrain.model.arch import load_model, load_tokenizer
    from posttrain.trainer.trainer import Trainer

    if not default_python().exists():
        results["vllm"] = {"skipped": f"no vLLM venv at {default_python()} (make vllm-venv)"}
        print(f"vllm: skipped, {results['vllm']['skipped']}", flush=True)
        return
    cuda = device.type == "cuda"
    preset = args.vllm_preset or ("qwen2.5-0.5b" if cuda else "small")
    out: dict[str, Any] = {"preset": preset, "dtype": "bfloat16" if cuda else "float32"}
    results["vllm"] = out
    with tempfile.TemporaryDirectory(prefix="gpu-check-vllm-") as tmp:
        model_dir = _vllm_model(preset, Path(tmp) / "model")
        tok = load_tokenizer(model_dir)
        # vLLM 0.32's CPU build dies when a seeded request's prefill is split (bench/engines.py, NO_PARTIAL_PREFILL)
        extra = () if cuda else ("--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192")
        vcfg = VLLMConfig(dtype=out["dtype"], memory_fraction=0.4 if cuda else 0.1, extra_args=extra)
        t0 = time.perf_counter()
        engine = VLLMEngine.start(model_dir, Path(tmp) / "run", tok, vcfg, lora_rank=16, seed=0, timeout_s=600)
        out["startup_s"] = time.perf_counter() - t0
        try:
            vocab = len(tok)
            reqs = requests(args.prompts, args.group, args.prompt_len, args.max_tokens, vocab, 1)
            engine.generate(reqs[:2])  # warm-up
            rates = []
            for step in range(1, 4):
                reqs = requests(args.prompts, args.group, args.prompt_len, args.max_tokens, vocab, step)
                t1 = time.perf_counter()
                groups = engine.generate(reqs)
                rates.append(sum(len(c.token_ids) for g in groups for c in g) / (time.perf_counter() - t1))
            out["gen_tokens_per_s"] = statistics.median(rates)
            out["gen_tokens_per_s_all"] = rates
            precision = "bf16_autocast" if cuda else "float32"
            for transport, lora in (("reload", None), ("lora", LoraConfig(rank=16, alpha=32))):
                model, _ = load_model(model_dir, device=str(device), dtype=torch.bfloat16 if cuda else None)
                trainer = Trainer(model, TrainerConfig(lr=1e-4, lora=lora, precision=precision))
                # the push timed alone: the probe (where engine/probe.py exists) is run and reported apart
                off = {"verify_sync": "off"} if "verify_sync" in EngineConfig.model_fields else {}
                sync = WeightSync(EngineConfig(kind="vllm", **off), engine, trainer, Path(tmp) / transport)
                if lora is not None:  # the adapter goes on top of the model the trainer started from
                    engine.update_weights(model_dir)
                version = sync.push()  # the trainer's weights (for LoRA: its fresh adapter)
                out[f"probe_{transport}_identical"] = _probe_gap(engine, trainer, version, device)
                times = []
                for _ in range(args.pushes):
                    stats = trainer.step(_parity_batch(engine.generate(requests(8, 4, args.prompt_len, 32, vocab, 7))))
                    t1 = time.perf_counter()
                    version = sync.push()
                    times.append(time.perf_counter() - t1)
                out[f"push_{transport}_s"] = statistics.median(times)
                out[f"push_{transport}_s_all"] = times
                out[f"probe_{transport}_after_step"] = _probe_gap(engine, trainer, version, device)
                out[f"last_outcome_{transport}"] = stats.outcome
                del trainer, model
                if cuda:
                    torch.cuda.empty_cache()
            out["engine_stats"] = engine.stats()
        finally:
            engine.close()
    print(
        f"vllm {preset} ({out['dtype']}): start-up {out['startup_s']:.1f} s | generation "
        f"{out['gen_tokens_per_s']:.0f} tok/s | push reload {out['push_reload_s'] * 1000:.0f} ms, "
        f"lora {out['push_lora_s'] * 1000:.0f} ms (write + load, median of {args.pushes}) | probe gap "
        f"{out['probe_reload_after_step']['max_diff']:.2e} (full), "
        f"{out['probe_lora_after_step']['max_diff']:.2e} (lora)",
        flush=True,
    )


STAGES = {"loop": run_loop, "lora": run_lora, "pinned": run_pinned, "vllm": run_vllm}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=list(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-5)
    ap.add_argument("--out", type=Path, default=Path("bench/results/gpu_check.json"))
    ap.add_argument("--stages", nargs="+", choices=list(STAGES), default=list(STAGES))
    ap.add_argument("--vllm-preset", choices=list(VLLM_SHAPES), help="default: qwen2.5-0.5b on CUDA, small on a CPU")
    ap.add_argument("--pushes", type=int, default=3, help="vllm stage: optimizer steps and pushes per transport")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "preset": args.preset,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    failed = False
    for stage in (STAGES[name] for name in args.stages):
        try:
            stage(args, device, results)
        except Exception:  # noqa: BLE001 - one stage failing still reports the others
            failed = True
            results[f"{stage.__name__}_error"] = traceback.format_exc()[-3000:]
            print(results[f"{stage.__name__}_error"], file=sys.stderr, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    loop = results.get("loop", {})
    if loop:
        print(
            f"\n{results['gpu']} | {results['parameters']:,} parameters | generation {loop['gen_tokens_per_s']:.0f} "
            "tok/s "
            f"| {loop['train_s_per_step']:.2f} s/train step | peak memory {loop['peak_memory_bytes'] / 2**30:.2f} GiB"
        )
        print(
            "loss curve (on-policy GRPO: ~0 by construction): " + " ".join(f"{c['loss']:+.2e}" for c in loop["curve"])
        )
        print("reward curve: " + " ".join(f"{c['reward_mean']:.4f}" for c in loop["curve"]))
    print(f"results: {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
