"""The demo's learning figure from fixed seeds: held-out mean accuracy before and
after `posttrain train configs/default.yaml`, median and spread over seeds.

Each seed builds its own embedded base model (base.seed) and runs the loop
(run.seed), so the spread covers both. Prints per-domain deltas, wall time
and peak RSS.

    .venv/bin/python bench/learning.py --seeds 0 1 2
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]


def one_seed(seed: int, out: Path, config: Path, extra: list[str]) -> dict:
    from posttrain.config import load_config
    from posttrain.loop import train

    cfg = load_config(config, [f"run.seed={seed}", f"base.seed={seed}", f"run.out_dir={out}", f"run.name=seed{seed}",
                               "run.progress=false", *extra])
    t0 = time.perf_counter()
    result = train(cfg, log=lambda *_: None)
    return {"seed": seed, "before": result.before, "after": result.after, "seconds": time.perf_counter() - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    ap.add_argument("overrides", nargs="*", help="dotted overrides applied to every seed")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            r = one_seed(seed, Path(tmp), args.config, args.overrides)
            gain = r["after"].mean_accuracy - r["before"].mean_accuracy
            print(f"seed {seed}: before {r['before'].mean_accuracy:.3f} after {r['after'].mean_accuracy:.3f} "
                  f"gain {gain:+.3f} ({r['seconds']:.0f} s incl. base build)", flush=True)
            for name, b in r["before"].results.items():
                a = r["after"].results[name].accuracy
                print(f"    {name:<10} {b.accuracy:.3f} -> {a:.3f} ({a - b.accuracy:+.3f})")
            runs.append(r)
    gains = [r["after"].mean_accuracy - r["before"].mean_accuracy for r in runs]
    worst = min(min(r["after"].results[d].accuracy - b.accuracy for d, b in r["before"].results.items()) for r in runs)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"mean-accuracy gain over {len(runs)} seeds: median {statistics.median(gains):+.3f}, "
          f"min {min(gains):+.3f}, max {max(gains):+.3f}; worst single-domain delta {worst:+.3f}; "
          f"median wall {statistics.median(r['seconds'] for r in runs):.0f} s per seed; peak RSS {peak_mib:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
