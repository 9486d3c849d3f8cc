"""Learning per step under two loss normalisations, side by side: the demo's loop
(configs/default.yaml) run for 151 steps per variant and seed, the held-out subset
evaluated every 25 steps. Prints per variant the gradient norm before clipping
(median, and its 10th-90th percentiles), the share of steps the clip at
trainer.grad_clip fired on, the held-out mean accuracy (the fixed subset) at steps
25/50/100/150 averaged over seeds, CPU seconds and peak RSS.

    nice .venv/bin/python bench/trainer_curves.py --seeds 0 1 [--jobs 2] [--model-path DIR]

Variants: `kept` (the loss normalised over the rows that enter it, micro-batches of
8: the trainer before 2026-11-30) and `sampled` (normalised over every row the step
sampled, automatic micro-batches: the default now); add more with --variant
NAME=override,override.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]
STEPS = (25, 50, 100, 150)
VARIANTS = {
    "kept": ["trainer.normalise=kept", "trainer.micro_batch_size=8"],
    "sampled": ["trainer.normalise=sampled"],
}


def one_run(name: str, overrides: list[str], seed: int, model_path: str | None) -> dict:
    from posttrain.configs import load_config
    from posttrain.loop import train

    with tempfile.TemporaryDirectory() as out:
        extra = [f"model.path={model_path}"] if model_path else [f"base.seed={seed}"]
        cfg = load_config(
            ROOT / "configs/default.yaml",
            [
                f"run.seed={seed}",
                f"run.out_dir={out}",
                f"run.name={name}-{seed}",
                "run.progress=false",
                "run.steps=151",
                "run.checkpoint_every=0",
                "eval.every_steps=25",
                *extra,
                *overrides,
            ],
        )
        c0 = time.process_time()
        result = train(cfg, log=lambda *_: None)
        cpu = time.process_time() - c0
        metrics = [json.loads(line) for line in open(result.run_dir / "metrics.jsonl")]
        history = json.loads((result.run_dir / "eval.json").read_text())["history"]
    steps = [m for m in metrics if m["kind"] == "train" and "grad_norm" in m]
    return {
        "variant": name,
        "seed": seed,
        "cpu_s": cpu,
        "grad_norms": [m["grad_norm"] for m in steps],
        "clip": cfg.trainer.grad_clip,
        "heldout": {h["step"]: h["mean_accuracy"] for h in history},
        "before": sum(v.accuracy for v in result.before.results.values()) / len(result.before.results),
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def summarise(runs: list[dict]) -> None:
    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["variant"], []).append(r)
    print(
        "| variant | grad norm median (p10-p90) | clip fired | "
        + " | ".join(f"held-out @{s}" for s in STEPS)
        + " | CPU-s per run | peak RSS MiB |"
    )
    print("|---|---|---|" + "---|" * len(STEPS) + "---|---|")
    for name, rs in by.items():
        norms = sorted(g for r in rs for g in r["grad_norms"])
        deciles = statistics.quantiles(norms, n=10)
        fired = sum(g > r["clip"] for r in rs for g in r["grad_norms"]) / len(norms)
        curve = [statistics.mean(r["heldout"].get(s, float("nan")) for r in rs) for s in STEPS]
        print(
            f"| {name} | {statistics.median(norms):.2f} ({deciles[0]:.2f}-{deciles[-1]:.2f}) | {fired:.0%} | "
            + " | ".join(f"{c:.3f}" for c in curve)
            + f" | {statistics.mean(r['cpu_s'] for r in rs):.0f} | {max(r['rss_mib'] for r in rs):.0f} |"
        )
    for r in runs:
        print(
            f"  {r['variant']} seed {r['seed']}: before {r['before']:.3f}, held-out "
            + ", ".join(f"@{s} {r['heldout'].get(s, float('nan')):.3f}" for s in STEPS)
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument(
        "--model-path",
        default=None,
        help="a base model directory for every seed (default: the "
        "demo's base of each seed, built into the cache when missing)",
    )
    ap.add_argument("--variant", action="append", default=[], help="NAME=override,override (adds a variant)")
    ap.add_argument("--only", nargs="*", default=None, help="run only these variants")
    args = ap.parse_args()
    variants = dict(VARIANTS)
    for spec in args.variant:
        name, _, rest = spec.partition("=")
        variants[name] = [o for o in rest.split(",") if o]
    if args.only:
        variants = {k: v for k, v in variants.items() if k in args.only}
    jobs = [(name, o, seed, args.model_path) for seed in args.seeds for name, o in variants.items()]
    with ProcessPoolExecutor(args.jobs) as pool:
        runs = list(pool.map(one_run, *zip(*jobs)))
    summarise(runs)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS of the largest run {kids:.0f} MiB")


if __name__ == "__main__":
    main()
