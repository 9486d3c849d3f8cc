"""The demo with each policy loss, side by side in one run: held-out gain over seeds, CPU, RSS.

Every (loss, seed) pair runs `posttrain train configs/default.yaml` with `trainer.loss.type=<loss>`
(each loss at its own defaults) and `run.seed=<seed>` on the same cached demo base (base.seed 0:
the seeds vary the RL run, not the base), in its own single-threaded worker process, then
prints per loss the held-out mean accuracy before and after, the gain (median, min, max and
mean +- sd over seeds), the CPU seconds (user+sys) of RL plus both evaluations, the peak RSS of
one run's process, and each loss's gain and CPU as ratios to GRPO's in this same run.

    .venv/bin/python bench/losses.py --seeds 0 1 2 --jobs 2 [--losses grpo rloo ...] [overrides...]
    .venv/bin/python bench/losses.py --from-log LOG   # the summary of a stopped bench's printed runs

Extra dotted overrides (for example `run.steps=150`) apply to every run.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]
LOSSES = ["grpo", "dapo", "rloo", "reinforce_pp", "gspo", "cispo"]


def cpu_seconds() -> float:
    """User+sys CPU seconds of this process and its waited-for children so far."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def one_run(loss: str, seed: int, config: Path, extra: list[str]) -> dict:
    """One demo run with `loss`; plain data only (it runs in a worker process)."""
    from posttrain.configs import load_config
    from posttrain.loop import train
    from posttrain.metrics_log import read_metrics
    from posttrain.model.pretrain import ensure_base

    with tempfile.TemporaryDirectory() as out:
        overrides = [f"trainer.loss.type={loss}", f"run.seed={seed}", f"run.out_dir={out}", "run.progress=false"]
        cfg = load_config(config, [*overrides, f"run.name={loss}-{seed}", *extra])
        if cfg.model.path is None:
            ensure_base(cfg.base, progress=False)
        t0, c0 = time.perf_counter(), cpu_seconds()
        result = train(cfg, log=lambda *_: None)
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        rows = read_metrics(result.run_dir / "metrics.jsonl", "train")
    acc = lambda t: {d: v.accuracy for d, v in t.results.items()}  # noqa: E731
    clip = [r["clip_frac"] for r in rows if r.get("clip_frac") is not None]
    return {
        "loss": loss,
        "seed": seed,
        "before": acc(result.before),
        "after": acc(result.after),
        "wall": wall,
        "cpu": cpu,
        "steps": len(rows),
        "clip_frac": statistics.mean(clip) if clip else 0.0,
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _mean(accs: dict) -> float:
    return sum(accs.values()) / len(accs)


def _gain(r: dict) -> float:
    return _mean(r["after"]) - _mean(r["before"])


def report_run(r: dict) -> None:
    deltas = " ".join(f"{d} {r['after'][d] - b:+.2f}" for d, b in r["before"].items())
    print(
        f"{r['loss']:<12} seed {r['seed']}: before {_mean(r['before']):.3f} after {_mean(r['after']):.3f} "
        f"gain {_gain(r):+.3f} ({deltas}); {r['steps']} steps, RL+evals {r['wall']:.0f} s wall, "
        f"{r['cpu']:.0f} CPU-s; mean clip_frac {r['clip_frac']:.3f}; peak RSS {r['rss_mib']:.0f} MiB",
        flush=True,
    )


_LINE = re.compile(
    r"^(?P<loss>\S+)\s+seed (?P<seed>\d+): before (?P<before>[\d.]+) after (?P<after>[\d.]+) gain \S+ "
    r"\(.*\); (?P<steps>\d+) steps, RL\+evals (?P<wall>\d+) s wall, (?P<cpu>\d+) CPU-s; "
    r"mean clip_frac (?P<clip>[\d.]+); peak RSS (?P<rss>\d+) MiB$"
)


def runs_from_log(path: Path) -> list[dict]:
    """The finished runs of an earlier bench's printed lines (`report_run`), for its summary when
    the bench was stopped before the end: the means per run, rounded as printed."""
    runs = []
    for line in path.read_text().splitlines():
        m = _LINE.match(line)
        if m:
            runs.append(
                {
                    "loss": m["loss"],
                    "seed": int(m["seed"]),
                    "before": {"mean": float(m["before"])},
                    "after": {"mean": float(m["after"])},
                    "wall": float(m["wall"]),
                    "cpu": float(m["cpu"]),
                    "steps": int(m["steps"]),
                    "clip_frac": float(m["clip"]),
                    "rss_mib": float(m["rss"]),
                }
            )
    return runs


def summary(runs: list[dict], losses: list[str]) -> None:
    by = {loss: sorted((r for r in runs if r["loss"] == loss), key=lambda r: r["seed"]) for loss in losses}
    ref = by.get("grpo")
    ref_gain = statistics.mean(_gain(r) for r in ref) if ref else None
    ref_cpu = statistics.mean(r["cpu"] for r in ref) if ref else None
    print(
        "\n| loss | before | after | gain median (min, max) | gain mean +- sd | gain / grpo | CPU-s mean | CPU / grpo "
        "| mean clip_frac | peak RSS MiB |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for loss, rs in by.items():
        gains = [_gain(r) for r in rs]
        cpu = statistics.mean(r["cpu"] for r in rs)
        sd = statistics.stdev(gains) if len(gains) > 1 else 0.0
        g_ratio = f"{statistics.mean(gains) / ref_gain:.2f}" if ref_gain else "-"
        c_ratio = f"{cpu / ref_cpu:.2f}" if ref_cpu else "-"
        print(
            f"| {loss} | {statistics.mean(_mean(r['before']) for r in rs):.3f} "
            f"| {statistics.mean(_mean(r['after']) for r in rs):.3f} "
            f"| {statistics.median(gains):+.3f} ({min(gains):+.3f}, {max(gains):+.3f}) "
            f"| {statistics.mean(gains):+.3f} +- {sd:.3f} | {g_ratio} | {cpu:.0f} | {c_ratio} "
            f"| {statistics.mean(r['clip_frac'] for r in rs):.3f} | {max(r['rss_mib'] for r in rs):.0f} |"
        )
    peak = max(r["rss_mib"] for r in runs)
    print(f"seeds {sorted({r['seed'] for r in runs})}; peak RSS of one run's process {peak:.0f} MiB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--losses", nargs="+", default=LOSSES, help=f"loss types to run (default: {' '.join(LOSSES)})")
    ap.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own worker process")
    ap.add_argument("overrides", nargs="*", help="dotted overrides applied to every run")
    ap.add_argument("--from-log", type=Path, help="only summarise the runs a stopped bench printed to this log")
    args = ap.parse_args()
    if args.from_log:
        done = runs_from_log(args.from_log)
        summary(done, [loss for loss in args.losses if any(r["loss"] == loss for r in done)])
        return 0
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    pairs = [(seed, loss) for seed in args.seeds for loss in args.losses]  # seed-major: every loss early
    runs = []
    with ProcessPoolExecutor(max(args.jobs, 1), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(one_run, loss, seed, args.config, args.overrides) for seed, loss in pairs]
        for f in as_completed(futures):
            runs.append(f.result())
            report_run(runs[-1])
    summary(runs, args.losses)
    return 0


if __name__ == "__main__":
    sys.exit(main())
