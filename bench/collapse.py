"""Collapse provoked by a high learning rate, with and without the monitor's countermeasure action.

Two arms per seed, run one after the other in this one process, identical but for the collapse
alarms' action: `log` (the alarm fires, nothing changes) against `countermeasures` (each firing
raises the domain's entropy bonus and diversity reward within monitor.countermeasures' bounds).
Prints, per seed and arm: the first alarm's step, the steps the entropy term was in the loss,
within-group diversity (distinct answers per group, the monitor's signal) over the baseline
steps and over the last steps, the policy entropy signal, held-out accuracy after, CPU seconds;
then the on/off ratios, and the peak RSS.

Run: OMP_NUM_THREADS=1 flock /tmp/heavy.lock .venv/bin/python bench/collapse.py --steps 40 --seeds 0 1 2
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import quiet_run

from posttrain.configs import load_config
from posttrain.loop import train
from posttrain.metrics_log import read_metrics

ROOT = Path(__file__).resolve().parent.parent
ARMS = {"off": "log", "on": "countermeasures"}


def overrides(steps: int, lr: float, seed: int, out: str, action: str) -> list[str]:
    """The provoked-collapse run: two demo domains, a learning rate far above the demo's, collapse
    alarms at half the baseline (both arms alike), the arm's action."""
    return [
        *quiet_run(steps, out),
        "tasks.domains={reverse: {difficulty: 1}, sort: {difficulty: 1}}",
        "rollout.prompts_per_step=16",
        f"trainer.lr={lr}",
        f"run.seed={seed}",
        f"trainer.seed={seed}",
        "monitor.probes.enabled=false",
        "monitor.alarms.entropy_collapse.ratio=0.5",
        "monitor.alarms.diversity_collapse.ratio=0.5",
        f"monitor.alarms.entropy_collapse.action={action}",
        f"monitor.alarms.diversity_collapse.action={action}",
        f"run.name={action}-{seed}",
    ]


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def summarise(run_dir: Path, tail: int) -> dict[str, Any]:
    """The run's alarm, bonus and diversity figures from its metrics.jsonl and eval.json."""
    rows = read_metrics(run_dir / "metrics.jsonl")
    monitor = [r for r in rows if r["kind"] == "monitor"]
    train_rows = [r for r in rows if r["kind"] == "train"]
    alarms = [r for r in rows if r["kind"] == "alarm" and r["alarm"].endswith("_collapse")]

    def signal(name: str, part: list[dict[str, Any]]) -> float:
        return _mean([v[name] for r in part for v in r["domains"].values()])

    after = json.loads((run_dir / "eval.json").read_text())["after"]["domains"]
    return {
        "first_alarm": min((r["step"] for r in alarms), default=None),
        "alarms": [f"{r['step']}:{r['alarm'].split('_')[0]}:{r['domain']}" for r in alarms],
        "bonus_steps": sum(1 for r in train_rows if r.get("entropy_bonus", 0.0) > 0),
        "coef_last": train_rows[-1].get("entropy_bonus_coef", {}),
        "diversity_weight_last": train_rows[-1].get("diversity_weight", {}),
        "distinct_base": signal("distinct_answers", monitor[:5]),
        "distinct_tail": signal("distinct_answers", monitor[-tail:]),
        "entropy_base": signal("entropy", monitor[:5]),
        "entropy_tail": signal("entropy", monitor[-tail:]),
        "reward_tail": signal("reward_mean", monitor[-tail:]),
        "heldout_after": _mean([d["accuracy"] for d in after.values() if d.get("accuracy") is not None]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--tail", type=int, default=10, help="last steps the 'tail' figures average over")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as out:
        for seed in args.seeds:
            for arm, action in ARMS.items():  # the arms alternate, so machine load hits both alike
                cfg = load_config(ROOT / "configs/default.yaml", overrides(args.steps, args.lr, seed, out, action))
                cpu, wall = time.process_time(), time.perf_counter()
                result = train(cfg, log=lambda *_: None)
                figures = summarise(result.run_dir, args.tail)
                figures["cpu_s"], figures["wall_s"] = time.process_time() - cpu, time.perf_counter() - wall
                results[f"{arm}/{seed}"] = figures
                print(f"{arm} seed {seed}: {json.dumps(figures)}", flush=True)
    print(f"\nprovoked collapse: lr {args.lr}, {args.steps} steps, reverse + sort, 16 prompts x 8, tail {args.tail}")
    head = f"{'arm/seed':9} {'alarm':>5} {'bonus':>5} {'div base':>8} {'div tail':>8} {'H base':>7} {'H tail':>7}"
    print(head + f" {'reward':>6} {'heldout':>7} {'cpu s':>6}")
    for key, f in results.items():
        print(
            f"{key:9} {str(f['first_alarm']):>5} {f['bonus_steps']:>5} {f['distinct_base']:8.3f} "
            f"{f['distinct_tail']:8.3f} {f['entropy_base']:7.3f} {f['entropy_tail']:7.3f} {f['reward_tail']:6.3f} "
            f"{f['heldout_after']:7.3f} {f['cpu_s']:6.1f}"
        )
    ratios = {
        name: [results[f"on/{s}"][name] / results[f"off/{s}"][name] for s in args.seeds if results[f"off/{s}"][name]]
        for name in ("distinct_tail", "entropy_tail", "heldout_after", "cpu_s")
    }
    for name, values in ratios.items():
        spread = f" (per seed {', '.join(f'{v:.2f}' for v in values)})"
        print(f"on/off {name}: mean {statistics.fmean(values):.3f}{spread}" if values else f"on/off {name}: n/a")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MiB")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "runs": results}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
