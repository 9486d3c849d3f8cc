"""The demo's learning figure from fixed seeds: held-out mean accuracy before and
after `posttrain train configs/default.yaml`, median and spread over seeds.

Each seed builds its own embedded base model (base.seed) and runs the loop
(run.seed), so the spread covers both. Prints per-domain deltas, and per seed
the wall time and CPU seconds (user+sys) of the base build and of the run
(RL plus both evaluations), then the peak RSS and the demo's pass criteria:
every seed gains >= +0.20, the median gain >= +0.25, no domain ends more than
0.02 below where it started.

    .venv/bin/python bench/learning.py --seeds 0 1 2 3 4 [--jobs 2]

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


def one_seed(seed: int, config: Path, extra: list[str]) -> dict:
    """Build (or reuse) seed's base, run the loop, evaluate; plain data only (it may run in a worker)."""
    from posttrain.configs import load_config
    from posttrain.loop import train
    from posttrain.model.pretrain import ensure_base, is_cached

    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(
            config,
            [
                f"run.seed={seed}",
                f"base.seed={seed}",
                f"run.out_dir={out}",
                f"run.name=seed{seed}",
                "run.progress=false",
                *extra,
            ],
        )
        cached = cfg.model.path is not None or is_cached(cfg.base)
        t0, c0 = time.perf_counter(), cpu_seconds()
        if cfg.model.path is None:
            ensure_base(cfg.base, progress=False)
        t1, c1 = time.perf_counter(), cpu_seconds()
        result = train(cfg, log=lambda *_: None)
        t2, c2 = time.perf_counter(), cpu_seconds()
    acc = lambda t: {d: v.accuracy for d, v in t.results.items()}  # noqa: E731
    return {
        "seed": seed,
        "before": acc(result.before),
        "after": acc(result.after),
        "cached": cached,
        "base_s": t1 - t0,
        "base_cpu": c1 - c0,
        "run_s": t2 - t1,
        "run_cpu": c2 - c1,
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _mean(accs: dict) -> float:
    return sum(accs.values()) / len(accs)


def report(r: dict) -> None:
    from posttrain.model.demo import verdict

    b, a = _mean(r["before"]), _mean(r["after"])
    base = "cached" if r["cached"] else f"{r['base_s']:.0f} s wall, {r['base_cpu']:.0f} CPU-s"
    print(
        f"seed {r['seed']}: before {b:.3f} after {a:.3f} gain {a - b:+.3f}; base build {base}; "
        f"RL+evals {r['run_s']:.0f} s wall, {r['run_cpu']:.0f} CPU-s; peak RSS {r['rss_mib']:.0f} MiB",
        flush=True,
    )
    for name, before in r["before"].items():
        after = r["after"][name]
        print(f"    {name:<10} {before:.3f} -> {after:.3f} ({after - before:+.3f})", flush=True)
    print("    " + verdict(r["before"], r["after"])[1], flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="seeds run at once, each in its own single-process worker (default 1: one after another)",
    )
    ap.add_argument("overrides", nargs="*", help="dotted overrides applied to every seed")
    args = ap.parse_args()
    runs = []
    if args.jobs <= 1:
        for seed in args.seeds:
            runs.append(one_seed(seed, args.config, args.overrides))
            report(runs[-1])
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(one_seed, seed, args.config, args.overrides) for seed in args.seeds]
            for f in as_completed(futures):
                runs.append(f.result())
                report(runs[-1])
        runs.sort(key=lambda r: r["seed"])
    gains = [_mean(r["after"]) - _mean(r["before"]) for r in runs]
    worst = min(min(r["after"][d] - b for d, b in r["before"].items()) for r in runs)
    peak_mib = max(r["rss_mib"] for r in runs)
    total = [r["base_s"] + r["run_s"] for r in runs]
    cpu = [r["base_cpu"] + r["run_cpu"] for r in runs]
    print(
        f"mean-accuracy gain over {len(runs)} seeds: median {statistics.median(gains):+.3f}, "
        f"min {min(gains):+.3f}, max {max(gains):+.3f}; worst single-domain delta {worst:+.3f}; "
        f"per seed (base build + RL + evals): median {statistics.median(total):.0f} s wall, "
        f"{statistics.median(cpu):.0f} CPU-s (max {max(cpu):.0f}); peak RSS of one seed's process {peak_mib:.0f} MiB"
    )
    ok = min(gains) >= MIN_GAIN - 1e-9 and statistics.median(gains) >= MIN_MEDIAN - 1e-9 and worst >= -MAX_FALL - 1e-9
    print(
        f"criteria (every seed >= {MIN_GAIN:+.2f}, median >= {MIN_MEDIAN:+.2f}, no domain below -{MAX_FALL:.2f}): "
        f"{'met' if ok else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
