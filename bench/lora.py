"""LoRA against full fine-tuning on the embedded model, at the same budget.

Runs the closed loop (configs/default.yaml: five procedural domains, the
embedded tiny base) once per variant with the same seed, steps and rollouts
per step, and prints side by side: held-out mean accuracy before and after,
the gain, wall time, trainable parameters, and the size of what a checkpoint
and a weight update carry (the adapter file against the full model file).
LoRA usually wants a larger learning rate than full fine-tuning, so the
default variants include LoRA at the full-FT rate and at 10x.

    .venv/bin/python bench/lora.py --steps 60
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]

VARIANTS = {
    "full lr=3e-4": ["trainer.lr=3e-4"],
    "lora r=8 lr=3e-4": ["trainer.lr=3e-4", "trainer.lora={rank: 8, alpha: 16}"],
    "lora r=8 lr=3e-3": ["trainer.lr=3e-3", "trainer.lora={rank: 8, alpha: 16}"],
}


def run_variant(name: str, extra: list[str], args: argparse.Namespace, out: Path) -> dict:
    from posttrain.configs import load_config
    from posttrain.loop import train
    from posttrain.trainer.checkpoint import latest_checkpoint

    cfg = load_config(
        args.config,
        [
            f"run.steps={args.steps}",
            f"run.seed={args.seed}",
            f"run.out_dir={out}",
            f"run.name={name.replace(' ', '_')}",
            "run.progress=false",
            "run.checkpoint_every=0",
            "monitor.report=false",
            f"run.threads={args.threads}",
            f"eval.tasks_per_domain={args.eval_tasks}",
            *extra,
        ],
    )
    t0 = time.perf_counter()
    result = train(cfg, log=lambda *_: None)
    ckpt = latest_checkpoint(result.run_dir)
    weights = sum(f.stat().st_size for f in ckpt.glob("*.safetensors"))
    optim = (ckpt / "optimizer.pt").stat().st_size
    return {
        "name": name,
        "before": result.before.mean_accuracy,
        "after": result.after.mean_accuracy,
        "seconds": time.perf_counter() - t0,
        "weights_bytes": weights,
        "optimizer_bytes": optim,
        "domains": {d: (result.before.results[d].accuracy, r.accuracy) for d, r in result.after.results.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-tasks", type=int, default=100)
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    ap.add_argument("--only", nargs="*", help="variant names to run (default: all)")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in VARIANTS.items():
            if args.only and name not in args.only:
                continue
            r = run_variant(name, extra, args, Path(tmp))
            rows.append(r)
            print(
                f"{name:18s} before {r['before']:.3f} after {r['after']:.3f} gain {r['after'] - r['before']:+.3f} "
                f"| weights file {r['weights_bytes'] / 1024:8.1f} KiB optimizer {r['optimizer_bytes'] / 1024:8.1f} KiB "
                f"| {r['seconds']:.0f} s",
                flush=True,
            )
            print("    " + " ".join(f"{d} {b:.2f}->{a:.2f}" for d, (b, a) in r["domains"].items()), flush=True)
    full = next((r for r in rows if r["name"].startswith("full")), None)
    if full:
        for r in rows:
            if r is not full:
                ratio = r["weights_bytes"] / full["weights_bytes"]
                gain = (r["after"] - r["before"]) - (full["after"] - full["before"])
                print(f"{r['name']}: checkpoint weights {ratio:.3f}x of full; held-out gain {gain:+.3f} against full")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
