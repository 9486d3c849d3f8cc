"""Collapse provoked by a domain with one easy rewarded answer, with and without the monitor's countermeasure action.

The provocation: `add_shortcut`, the built-in `add` tasks (level 1) under a verifier that pays 0.5
for one answer, |a - b|, the one the embedded base was pretrained to give most of the time (its
buggy solver subtracts), and 0 for anything else. Every group soon gives that one answer: reward
0.5 at most (the domain is never "solved", so the collapse alarms stay armed), distinct answers
per group down to 1/G.

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
from posttrain.domains.add import Add
from posttrain.domains.base import extract_answer, question_match
from posttrain.domains.registry import register
from posttrain.loop import train
from posttrain.metrics_log import read_metrics
from posttrain.types import Episode, Score, Task


class OneAnswer:
    """0.5 for |a - b| (one rewarded answer, the base's pretrained bug); 0 otherwise."""

    name, version, cheap = "one_answer", "1", True

    def score(self, task: Task, episode: Episode) -> Score:
        a, b = (int(x) for x in question_match(task, r"\s*(\d+)\s*\+\s*(\d+)\s*=\s*").groups())
        ok = extract_answer(episode.completion) == str(abs(a - b))
        return Score(0.5 if ok else 0.0, {"shortcut": float(ok)}, ok, "" if ok else "not the rewarded answer")


class AddShortcut(Add):
    name = "add_shortcut"
    verifier = OneAnswer()


ROOT = Path(__file__).resolve().parent.parent
ARMS = {"off": "log", "on": "countermeasures"}
ENTROPY = (0.25, 1.0)
"""monitor.countermeasures.entropy_step and entropy_max of both arms (only `on` uses them)."""
RATIO = 0.7
"""monitor.alarms.*_collapse.ratio of both arms: the alarm fires below 70% of the baseline."""
DIVERSITY = (0.25, 0.5)
"""monitor.countermeasures.diversity_step and diversity_max of both arms."""


def overrides(steps: int, lr: float, seed: int, out: str, action: str, difficulty: int) -> list[str]:
    """The provoked-collapse run: the shortcut domain, collapse alarms at half the baseline (both
    arms alike), the arm's action."""
    return [
        *quiet_run(steps, out),
        f"tasks.domains={{add_shortcut: {{difficulty: {difficulty}}}}}",
        "rollout.prompts_per_step=16",
        f"trainer.lr={lr}",
        f"run.seed={seed}",
        f"trainer.seed={seed}",
        "monitor.probes.enabled=false",
        f"monitor.alarms.entropy_collapse.ratio={RATIO}",
        f"monitor.alarms.diversity_collapse.ratio={RATIO}",
        f"monitor.alarms.entropy_collapse.action={action}",
        f"monitor.alarms.diversity_collapse.action={action}",
        f"monitor.countermeasures.entropy_step={ENTROPY[0]}",
        f"monitor.countermeasures.entropy_max={ENTROPY[1]}",
        f"monitor.countermeasures.diversity_step={DIVERSITY[0]}",
        f"monitor.countermeasures.diversity_max={DIVERSITY[1]}",
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
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--difficulty", type=int, default=1)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--tail", type=int, default=10, help="last steps the 'tail' figures average over")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--keep", type=Path, default=None, help="write the run directories here (default: a temp dir)")
    args = parser.parse_args()
    register(AddShortcut())
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = str(args.keep or tmp)
        # warm-up (not reported): the first run in a process pays the imports and the base's load
        warm = [*overrides(2, args.lr, 0, tmp, "log", 1), "run.name=warmup"]
        train(load_config(ROOT / "configs/default.yaml", warm), log=lambda *_: None)
        for seed in args.seeds:
            for arm in args.arms:  # the arms alternate, so machine load hits both alike
                extra = overrides(args.steps, args.lr, seed, out, ARMS[arm], args.difficulty)
                cfg = load_config(ROOT / "configs/default.yaml", extra)
                cpu, wall = time.process_time(), time.perf_counter()
                result = train(cfg, log=lambda *_: None)
                figures = summarise(result.run_dir, args.tail)
                figures["cpu_s"], figures["wall_s"] = time.process_time() - cpu, time.perf_counter() - wall
                results[f"{arm}/{seed}"] = figures
                print(f"{arm} seed {seed}: {json.dumps(figures)}", flush=True)
    print(
        f"\nprovoked collapse: add_shortcut (difficulty {args.difficulty}), lr {args.lr}, {args.steps} steps, "
        f"16 prompts x 8, tail {args.tail}"
    )
    head = f"{'arm/seed':9} {'alarm':>5} {'bonus':>5} {'div base':>8} {'div tail':>8} {'H base':>7} {'H tail':>7}"
    print(head + f" {'reward':>6} {'heldout':>7} {'cpu s':>6}")
    for key, f in results.items():
        print(
            f"{key:9} {str(f['first_alarm']):>5} {f['bonus_steps']:>5} {f['distinct_base']:8.3f} "
            f"{f['distinct_tail']:8.3f} {f['entropy_base']:7.3f} {f['entropy_tail']:7.3f} {f['reward_tail']:6.3f} "
            f"{f['heldout_after']:7.3f} {f['cpu_s']:6.1f}"
        )
    paired = [s for s in args.seeds if f"on/{s}" in results and f"off/{s}" in results]
    ratios = {
        name: [results[f"on/{s}"][name] / results[f"off/{s}"][name] for s in paired if results[f"off/{s}"][name]]
        for name in ("distinct_tail", "entropy_tail", "reward_tail", "heldout_after", "cpu_s")
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
