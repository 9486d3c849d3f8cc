"""trainer.replay on a hard mix: `posttrain train` with the replay buffer against without it, the
same seeds, side by side in one run: the held-out gain (mean and the hard domain's), the
training CPU (run.cpu_budget_s's count: the steps only), and the replay's share, age and ratio.

The mix is configs/peer-harder.yaml (the demo's base and domains with `reverse` one level up:
correct samples of it are rare, 0.02 pass@8 on the base), shortened to --steps steps. Each
seed runs twice in a row, without and with `trainer.replay.enabled=true` (the defaults: admit
rare, share 0.125, max_age 8, max_replays 2, capacity 32; or what --replay sets), from the same
cached base with the same run.seed, so the pair differs only by the buffer. Evaluations only
before and after training (eval.every_steps=0), on a held-out set of --eval-tasks tasks per
domain. Each run is a child process; its peak RSS is the child's own (os.wait4).

    flock /tmp/heavy.lock .venv/bin/python bench/replay.py --steps 300 --seeds 0 1 2   # ~20 min on 2 cores
    .venv/bin/python bench/replay.py --steps 4 --seeds 0 --eval-tasks 8   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "peer-harder.yaml"
HARD = "reverse"


def overrides(seed: int, steps: int, eval_tasks: int, out: Path, name: str, replay: list[str]) -> list[str]:
    return [
        f"run.seed={seed}",
        f"run.steps={steps}",
        f"run.out_dir={out}",
        f"run.name={name}",
        "run.checkpoint_every=0",
        "run.progress=false",
        "monitor.report=false",
        f"eval.tasks_per_domain={eval_tasks}",
        "eval.every_steps=0",
        "eval.samples=0",
        "eval.above_tasks=0",
        *replay,
    ]


def run_one(seed: int, arm: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    name = f"{arm}-s{seed}"
    replay = ["trainer.replay.enabled=true", *args.replay] if arm == "replay" else []
    cmd = [sys.executable, "-m", "posttrain.cli", "train", str(args.config)]
    cmd += overrides(seed, args.steps, args.eval_tasks, out, name, replay)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT)
    assert proc.stdout is not None
    log = proc.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{name} failed:\n{log[-4000:]}")
    return summarise(out / name, seed, arm, time.perf_counter() - t0, usage.ru_maxrss / 1024)


def summarise(run_dir: Path, seed: int, arm: str, wall_s: float, rss_mib: float) -> dict[str, Any]:
    from posttrain.metrics_log import read_metrics
    from posttrain.trace import TraceStore

    ev = json.loads((run_dir / "eval.json").read_text())
    acc = lambda t: {d: v["accuracy"] for d, v in t["domains"].items()}  # noqa: E731
    rows = read_metrics(run_dir / "metrics.jsonl", "train")
    replayed = [r for r in rows if r.get("replay_groups")]
    mean = lambda key: statistics.fmean(r[key] for r in replayed) if replayed else 0.0  # noqa: E731
    acct = TraceStore(run_dir / "trace.db").accounting()
    return {
        "seed": seed,
        "arm": arm,
        "before": acc(ev["before"]),
        "after": acc(ev["after"]),
        "train_cpu_s": rows[-1]["train_cpu_s"],
        "wall_s": wall_s,
        "rss_mib": rss_mib,
        "steps_replaying": len(replayed),
        "replay_share": mean("replay_share"),
        "replay_age": mean("replay_age_mean"),
        "replay_ratio": mean("replay_ratio_mean"),
        "replay_clipped": mean("replay_clipped"),
        "admitted": rows[-1].get("replay_admitted_total", 0),
        "accounting_exact": acct.exact,
        "replayed_groups": acct.replayed,
    }


def _m(accs: dict[str, float]) -> float:
    return sum(accs.values()) / len(accs)


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| seed | arm | held-out before | after | gain | reverse before -> after | train CPU-s "
        "| replay share | age | ratio | clipped | peak RSS MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        b, a = _m(r["before"]), _m(r["after"])
        lines.append(
            f"| {r['seed']} | {r['arm']} | {b:.3f} | {a:.3f} | {a - b:+.3f} | {r['before'][HARD]:.2f} -> "
            f"{r['after'][HARD]:.2f} | {r['train_cpu_s']:.0f} | {r['replay_share']:.3f} | {r['replay_age']:.2f} | "
            f"{r['replay_ratio']:.4f} | {r['replay_clipped']:.4f} | {r['rss_mib']:.0f} |"
        )
    return "\n".join(lines)


def summary(runs: list[dict[str, Any]]) -> str:
    by = {arm: [r for r in runs if r["arm"] == arm] for arm in ("off", "replay")}
    out = []
    for arm, rs in by.items():
        gains = [_m(r["after"]) - _m(r["before"]) for r in rs]
        hard = [r["after"][HARD] - r["before"][HARD] for r in rs]
        cpu = [r["train_cpu_s"] for r in rs]
        out.append(
            f"{arm:>6}: gain mean {statistics.fmean(gains):+.3f} (per seed {', '.join(f'{g:+.3f}' for g in gains)}); "
            f"{HARD} gain mean {statistics.fmean(hard):+.3f}; train CPU-s mean {statistics.fmean(cpu):.0f}"
        )
    pairs = list(zip(by["off"], by["replay"]))
    diff = [(_m(b["after"]) - _m(b["before"])) - (_m(a["after"]) - _m(a["before"])) for a, b in pairs]
    cpu_ratio = [b["train_cpu_s"] / a["train_cpu_s"] for a, b in pairs]
    out.append(
        f"replay - off, paired by seed: gain {', '.join(f'{d:+.3f}' for d in diff)} "
        f"(mean {statistics.fmean(diff):+.3f}); "
        f"train CPU ratio replay/off {', '.join(f'{c:.2f}' for c in cpu_ratio)}"
    )
    out.append(
        f"trace accounting exact in every run: {all(r['accounting_exact'] for r in runs)}; "
        f"peak RSS of one run's process {max(r['rss_mib'] for r in runs):.0f} MiB"
    )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--eval-tasks", type=int, default=50)
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--replay", nargs="*", default=[], help="extra trainer.replay.* overrides for the replay arm")
    ap.add_argument("--json", type=Path, help="write every run's figures here")
    ap.add_argument("--arms", nargs="+", choices=["off", "replay"], default=["off", "replay"], help="which arms to run")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for arm in args.arms:
                runs.append(run_one(seed, arm, args, Path(tmp)))
                r = runs[-1]
                print(
                    f"seed {seed} {arm}: {_m(r['before']):.3f} -> {_m(r['after']):.3f}, {HARD} "
                    f"{r['before'][HARD]:.2f} -> {r['after'][HARD]:.2f}, train {r['train_cpu_s']:.0f} CPU-s, "
                    f"{r['wall_s']:.0f} s wall",
                    flush=True,
                )
    print(f"\n{args.config.name}, {args.steps} steps, held-out {args.eval_tasks} tasks per domain\n")
    print(table(runs))
    if len(args.arms) == 2:
        print()
        print(summary(runs))
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
