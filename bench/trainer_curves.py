"""Learning per step under trainer variants, side by side: a posttrain loop (the demo's,
configs/default.yaml, unless --config) run per variant and seed, the held-out subset
evaluated every 25 steps. Prints per variant the gradient norm before clipping
(median, and its 10th-90th percentiles), the share of steps the clip at
trainer.grad_clip fired on, the held-out mean accuracy at --steps averaged over seeds,
each later variant's paired difference from the first (mean over seeds, with its
standard error), CPU seconds and peak RSS.

    nice .venv/bin/python bench/trainer_curves.py --seeds 0 1 [--jobs 2] [--model-path DIR]
    nice .venv/bin/python bench/trainer_curves.py --config configs/peer-buggier.yaml --only coast skip \
        --steps 25 50 75 100 150 200 250 --set eval.subset_tasks=100 --seeds 0 1 2 3 4 5 6 7 --jobs 2

Variants: `kept` (the loss normalised over the rows that enter it, micro-batches of
8: the trainer before 2026-11-30), `sampled` (normalised over every row the step
sampled, automatic micro-batches), `coast` (the default now: `sampled`, and a step
without signal still takes Adam's zero-gradient step) and `skip` (such a step changes
nothing: the trainer before 2026-12-01); add more with --variant NAME=override,override.
Without --model-path, a config whose base is the demo's builds one base per seed; any
other config runs every seed on its own base (the model cache).
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
DEMO = ROOT / "configs/default.yaml"
VARIANTS = {
    "kept": ["trainer.normalise=kept", "trainer.micro_batch_size=8", "trainer.coast=false"],
    "sampled": ["trainer.normalise=sampled", "trainer.coast=false"],
    "coast": ["trainer.normalise=sampled", "trainer.coast=true"],
}
VARIANTS["skip"] = VARIANTS["sampled"]  # the same runs, named for the comparison with `coast`


def one_run(
    name: str, overrides: list[str], seed: int, model_path: str | None, config: str, steps: int, common: list[str]
) -> dict:
    from posttrain.configs import load_config
    from posttrain.loop import train

    with tempfile.TemporaryDirectory() as out:
        extra = [f"model.path={model_path}"] if model_path else [f"base.seed={seed}"] if Path(config) == DEMO else []
        cfg = load_config(
            config,
            [
                f"run.seed={seed}",
                f"run.out_dir={out}",
                f"run.name={name}-{seed}",
                "run.progress=false",
                f"run.steps={steps}",
                "run.checkpoint_every=0",
                "monitor.report=false",
                "eval.every_steps=25",
                *common,
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


def summarise(runs: list[dict], steps: list[int]) -> None:
    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["variant"], []).append(r)
    print(
        "| variant | grad norm median (p10-p90) | clip fired | "
        + " | ".join(f"held-out @{s}" for s in steps)
        + " | CPU-s per run | peak RSS MiB |"
    )
    print("|---|---|---|" + "---|" * len(steps) + "---|---|")
    for name, rs in by.items():
        norms = sorted(g for r in rs for g in r["grad_norms"])
        deciles = statistics.quantiles(norms, n=10)
        fired = sum(g > r["clip"] for r in rs for g in r["grad_norms"]) / len(norms)
        curve = [statistics.mean(r["heldout"].get(s, float("nan")) for r in rs) for s in steps]
        print(
            f"| {name} | {statistics.median(norms):.2f} ({deciles[0]:.2f}-{deciles[-1]:.2f}) | {fired:.0%} | "
            + " | ".join(f"{c:.3f}" for c in curve)
            + f" | {statistics.mean(r['cpu_s'] for r in rs):.0f} | {max(r['rss_mib'] for r in rs):.0f} |"
        )
    names = list(by)
    first = {r["seed"]: r for r in by[names[0]]}
    for name in names[1:]:
        cells = []
        for s in steps:
            d = [r["heldout"][s] - first[r["seed"]]["heldout"][s] for r in by[name] if r["seed"] in first]
            se = statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else float("nan")
            cells.append(f"{statistics.mean(d):+.3f} ± {se:.3f}")
        print(f"| {name} - {names[0]} (paired by seed) | | | " + " | ".join(cells) + " | | |")
    for r in runs:
        print(
            f"  {r['variant']} seed {r['seed']}: before {r['before']:.3f}, held-out "
            + ", ".join(f"@{s} {r['heldout'].get(s, float('nan')):.3f}" for s in steps)
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
    ap.add_argument("--only", nargs="*", default=None, help="run only these variants (in this order)")
    ap.add_argument("--config", default=str(DEMO), help="the posttrain config to run (default: the demo's)")
    ap.add_argument("--steps", type=int, nargs="+", default=[25, 50, 100, 150], help="held-out steps to report")
    ap.add_argument("--set", action="append", default=[], help="an override for every variant (repeatable)")
    args = ap.parse_args()
    variants = dict(VARIANTS)
    for spec in args.variant:
        name, _, rest = spec.partition("=")
        variants[name] = [o for o in rest.split(",") if o]
    if args.only:
        variants = {k: variants[k] for k in args.only}
    if any(s % 25 for s in args.steps):
        raise SystemExit("--steps: the held-out set is evaluated every 25 steps")
    run_steps = max(args.steps) + 1
    jobs = [
        (name, o, seed, args.model_path, str(Path(args.config).resolve()), run_steps, args.set)
        for seed in args.seeds
        for name, o in variants.items()
    ]
    with ProcessPoolExecutor(args.jobs) as pool:
        runs = list(pool.map(one_run, *zip(*jobs)))
    summarise(runs, args.steps)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS of the largest run {kids:.0f} MiB")


if __name__ == "__main__":
    main()
