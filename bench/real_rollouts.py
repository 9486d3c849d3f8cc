"""The real model's RL steps, variant against variant: what the rollouts cost and what they do to the step.

Each variant is `posttrain train configs/real.yaml` (SmolLM2-135M-Instruct, LoRA, the staged
pipeline) for a few steps in its own process, one after another in this run, with the same seed
(the same prompts drawn); from each step's metrics row: the rollout seconds, the tokens sampled
and their rate, the train pass's seconds, the step's CPU seconds (the process's, rollouts
included), the train-inference mismatch (mean |trainer log-prob - engine log-prob| before the
update) and the process's peak RSS. The first step is left out of
the rates (its first generate call warms the kernels). Variants:

    fp32      the defaults: the engine generates with the trained module (float32, LoRA unmerged)
    bf16      engine.generate_dtype bfloat16: a merged bf16 copy, refreshed every push, with the
              mismatch corrected by tis (engine/copy.py)
    fp32copy  engine.generate_dtype float32: a merged float32 copy (the adapters' matmuls gone)
    nogather  pipeline.gather_share 0: each generate call starts on what is queued (the calls of
              `pipeline.gather_share` ungathered)

    make install-real        # once: the model extra and its cached folder
    PYTHONPATH=src .venv/bin/python bench/real_rollouts.py --variants fp32,bf16 --steps 3
    PYTHONPATH=src .venv/bin/python bench/real_rollouts.py --refresh     # the copy's refresh: seconds, peak RSS

Prints one row per variant and each variant's ratios to the first; results and the command in
bench/RESULTS.md ("Real model rollouts in bfloat16"). Nothing is asserted: figures, not tests.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = {
    "fp32": [],
    "bf16": ["engine.generate_dtype=bfloat16", "trainer.mismatch.correction=tis"],
    "fp32copy": ["engine.generate_dtype=float32"],
    "nogather": ["pipeline.gather_share=0"],
}


def run_variant(name: str, steps: int, seed: int, out: Path, extra: list[str], keep: Path | None) -> dict:
    """One variant's run; its train rows' figures (steps after the first) and the wall time; with
    `keep`, its metrics.jsonl copied there."""
    cmd = [
        sys.executable, "-m", "posttrain", "train", str(ROOT / "configs" / "real.yaml"),
        f"run.steps={steps}", f"run.seed={seed}", "run.checkpoint_every=0", "run.progress=false",
        f"run.out_dir={out}", f"run.name={name}", "eval.tasks_per_domain=1", "eval.contamination=false",
        "monitor.report=false", *VARIANTS[name], *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"variant {name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r.get("kind") == "train"]
    if keep is not None:
        shutil.copy(out / name / "metrics.jsonl", keep / f"{name}.metrics.jsonl")
    timed = train[1:]
    rollout_s = sum(r["rollout_s"] for r in timed)
    tokens = sum(r["tokens_sampled"] for r in timed)
    return {
        "variant": name,
        "steps_timed": len(timed),
        "rollout_s": rollout_s,
        "tokens": tokens,
        "tok_per_s": tokens / rollout_s if rollout_s else 0.0,
        "step_s": sum(r["seconds"] for r in timed) / len(timed),
        "step_cpu_s": (train[-1]["train_cpu_s"] - train[0]["train_cpu_s"]) / len(timed),  # the count is cumulative
        "mismatch": max(r["mismatch_abs_mean"] for r in timed),
        "reward": sum(r["reward_mean"] for r in train) / len(train),
        "peak_rss_mib": max(r["peak_rss_mib"] for r in train),
        "wall_s": wall,
    }


def refresh_cost(repeats: int = 3) -> None:
    """The bf16 copy's refresh on the real model with configs/real.yaml's adapters: its seconds
    (best of `repeats`) and how far it raises the process's peak RSS (VmHWM, reset first)."""
    from posttrain.configs import load_config
    from posttrain.engine.copy import InferenceCopy
    from posttrain.model.arch import load_model
    from posttrain.model.real import resolve
    from posttrain.trainer.lora import apply_lora

    cfg = load_config(ROOT / "configs" / "real.yaml")
    model = apply_lora(load_model(resolve(cfg.model.path))[0], cfg.trainer.lora)
    held = InferenceCopy(model, "bfloat16")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to the current RSS
    before, times = _vm_hwm_mib(), []
    for _ in range(repeats):
        t0 = time.perf_counter()
        held.refresh()
        times.append(time.perf_counter() - t0)
    print(f"refresh of the bf16 copy: {min(times):.2f} s (best of {repeats}), peak RSS +{_vm_hwm_mib() - before} MiB")


def _vm_hwm_mib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="fp32,bf16", help=f"comma-separated, from {sorted(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=3, help="steps a variant (the first is not timed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], help="one more override for every variant")
    ap.add_argument("--keep", type=Path, help="copy each variant's metrics.jsonl into this folder")
    ap.add_argument("--refresh", action="store_true", help="time the bf16 copy's refresh instead (no training)")
    args = ap.parse_args()
    if args.refresh:
        refresh_cost()
        return
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        raise SystemExit(f"--variants: unknown {unknown}; choose from {sorted(VARIANTS)}")
    if args.steps < 2:
        raise SystemExit("--steps: at least 2 (the first step is not timed)")
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="real-rollouts-") as tmp:
        results = []
        for name in names:
            print(f"{time.strftime('%H:%M:%S')} {name}: {args.steps} steps ...", flush=True)
            results.append(run_variant(name, args.steps, args.seed, Path(tmp), args.set, args.keep))
            r = results[-1]
            print(
                f"  rollout {r['rollout_s']:.1f} s for {r['tokens']} tokens ({r['tok_per_s']:.1f} tok/s), "
                f"train pass {r['step_s']:.1f} s, step {r['step_cpu_s']:.1f} CPU-s, mismatch {r['mismatch']:.4f}, "
                f"reward {r['reward']:.3f}, peak RSS {r['peak_rss_mib']:,.0f} MiB, wall {r['wall_s']:.0f} s",
                flush=True,
            )
    base = results[0]
    b = base["variant"]
    print(f"\n| variant | rollout tok/s | over {b} | train pass s | CPU-s a step | over {b} | mismatch | peak RSS |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        ratio = r["tok_per_s"] / base["tok_per_s"] if base["tok_per_s"] else 0.0
        cpu = base["step_cpu_s"] / r["step_cpu_s"] if r["step_cpu_s"] else 0.0
        print(
            f"| {r['variant']} | {r['tok_per_s']:.1f} | {ratio:.2f}x | {r['step_s']:.1f} | {r['step_cpu_s']:.1f} | "
            f"{cpu:.2f}x less | {r['mismatch']:.4f} | {r['peak_rss_mib']:,.0f} MiB |"
        )


if __name__ == "__main__":
    main()
