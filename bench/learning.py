"""The demo's learning figure from fixed seeds: held-out mean accuracy before and
after `posttrain train configs/default.yaml`, median and spread over seeds.

Each seed builds its own embedded base model (base.seed) and runs the loop
(run.seed), so the spread covers both. Prints per-domain deltas, and per seed
the wall time and CPU seconds (user+sys) of the base build and of the run
(RL plus both evaluations), then the peak RSS and the demo's pass criteria:
every seed gains >= +0.20, the median gain >= +0.25, no domain ends more than
0.02 below where it started.

    .venv/bin/python bench/learning.py --seeds 0 1 2 3 4

A base already in the model cache (POSTTRAIN_CACHE) is reused, and its build is
then reported as cached; point POSTTRAIN_CACHE at an empty folder to time builds.
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
MIN_GAIN, MIN_MEDIAN, MAX_FALL = 0.20, 0.25, 0.02


def cpu_seconds() -> float:
    """User+sys CPU seconds of this process and its waited-for children so far."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def one_seed(seed: int, out: Path, config: Path, extra: list[str]) -> dict:
    from posttrain.config import load_config
    from posttrain.loop import train
    from posttrain.model.pretrain import default_dir, ensure_base

    cfg = load_config(config, [f"run.seed={seed}", f"base.seed={seed}", f"run.out_dir={out}", f"run.name=seed{seed}",
                               "run.progress=false", *extra])
    cached = cfg.model.path is not None or (default_dir(cfg.base) / "config.json").is_file()
    t0, c0 = time.perf_counter(), cpu_seconds()
    if cfg.model.path is None:
        ensure_base(cfg.base, progress=False)
    t1, c1 = time.perf_counter(), cpu_seconds()
    result = train(cfg, log=lambda *_: None)
    t2, c2 = time.perf_counter(), cpu_seconds()
    return {"seed": seed, "before": result.before, "after": result.after, "cached": cached,
            "base_s": t1 - t0, "base_cpu": c1 - c0, "run_s": t2 - t1, "run_cpu": c2 - c1}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    ap.add_argument("overrides", nargs="*", help="dotted overrides applied to every seed")
    args = ap.parse_args()
    from posttrain.model.demo import verdict

    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            r = one_seed(seed, Path(tmp), args.config, args.overrides)
            gain = r["after"].mean_accuracy - r["before"].mean_accuracy
            base = "cached" if r["cached"] else f"{r['base_s']:.0f} s wall, {r['base_cpu']:.0f} CPU-s"
            print(f"seed {seed}: before {r['before'].mean_accuracy:.3f} after {r['after'].mean_accuracy:.3f} "
                  f"gain {gain:+.3f}; base build {base}; RL+evals {r['run_s']:.0f} s wall, {r['run_cpu']:.0f} CPU-s",
                  flush=True)
            for name, b in r["before"].results.items():
                a = r["after"].results[name].accuracy
                print(f"    {name:<10} {b.accuracy:.3f} -> {a:.3f} ({a - b.accuracy:+.3f})", flush=True)
            acc = lambda t: {d: v.accuracy for d, v in t.results.items()}  # noqa: E731
            print("    " + verdict(acc(r["before"]), acc(r["after"]))[1], flush=True)
            runs.append(r)
    gains = [r["after"].mean_accuracy - r["before"].mean_accuracy for r in runs]
    worst = min(min(r["after"].results[d].accuracy - b.accuracy for d, b in r["before"].results.items()) for r in runs)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    total = [r["base_s"] + r["run_s"] for r in runs]
    cpu = [r["base_cpu"] + r["run_cpu"] for r in runs]
    print(f"mean-accuracy gain over {len(runs)} seeds: median {statistics.median(gains):+.3f}, "
          f"min {min(gains):+.3f}, max {max(gains):+.3f}; worst single-domain delta {worst:+.3f}; "
          f"per seed (base build + RL + evals): median {statistics.median(total):.0f} s wall, "
          f"{statistics.median(cpu):.0f} CPU-s; peak RSS {peak_mib:.0f} MiB")
    ok = min(gains) >= MIN_GAIN - 1e-9 and statistics.median(gains) >= MIN_MEDIAN - 1e-9 and worst >= -MAX_FALL - 1e-9
    print(f"criteria (every seed >= {MIN_GAIN:+.2f}, median >= {MIN_MEDIAN:+.2f}, no domain below -{MAX_FALL:.2f}): "
          f"{'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
