"""`posttrain plan` checked against reality: for two task mixes, real `posttrain train` runs on
this machine at three execute-worker splits (pipeline.execute_workers 1, 2, 4; pipeline.mode
sync), then the planner, fed ONE run's trace per mix (the execute_workers=1 run), predicts the
steps per hour of every split; predicted and measured side by side, the error per split, and
the peak RSS of each training process. Two predictions per split: `replay` (the source run's
groups in their order: the runs share seed 0, so every split draws the same tasks) and
`bootstrap` (groups drawn at random from the source run, 200 replicas averaged).

The mixes (both use bench/async_loop.py's `slowadd`: addition questions whose check runs in the
sandbox after sleeping a heavy-tailed, per-task time, Pareto scale 0.5 s shape 1, cap 10 s):

- `slowadd`: slowadd alone.
- `slowadd+add`: slowadd and the built-in `add` (no execution) half and half.

Every run: the cached demo base, seed 0, 4 prompts x 2 samples per step, dynamic sampling off,
no evaluation inside the loop, sandbox.workers 64. Measured steps per hour: the train steps
over the time from the row before the first step (the evaluation before training) to the
last step's row in metrics.jsonl.

    flock /tmp/heavy.lock .venv/bin/python bench/planner.py --steps 8      # ~8 min on 2 shared cores
    .venv/bin/python bench/planner.py --plan-only /tmp/posttrain-bench-planner/STAMP  # re-plan saved runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

MIXES = {
    "slowadd": "tasks.domains={slowadd: {difficulty: 1}}",
    "slowadd+add": "tasks.domains={slowadd: {difficulty: 1}, add: {difficulty: 1}}",
}
SPLITS = (1, 2, 4)


def overrides(mix: str, workers: int, steps: int, out: Path, model: str) -> list[str]:
    return [
        f"model.path={model}",
        f"run.out_dir={out}",
        f"run.name={mix}-ew{workers}",
        f"run.steps={steps}",
        "run.threads=1",
        "run.seed=0",
        f"run.checkpoint_every={steps}",
        "run.progress=false",
        "monitor.report=false",
        MIXES[mix],
        "rollout.prompts_per_step=4",
        "rollout.group_size=2",
        "rollout.dynamic_sampling=false",
        "eval.tasks_per_domain=8",
        "eval.every_steps=0",
        "eval.samples=0",
        "eval.above_tasks=0",
        "sandbox.workers=64",
        f"pipeline.execute_workers={workers}",
        "pipeline.mode=sync",
    ]


def child(argv: list[str]) -> int:
    """`--child OVERRIDES...`: `posttrain train` with `slowadd` registered."""
    from async_loop import register

    register()
    from posttrain.cli import main

    return main(["train", *argv])


def measure(mix: str, workers: int, steps: int, out: Path, model: str) -> dict[str, Any]:
    from posttrain.metrics_log import read_metrics

    args = [sys.executable, __file__, "--child", *overrides(mix, workers, steps, out, model)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    log = proc.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{mix} execute_workers={workers} failed:\n{log[-4000:]}")
    run_dir = out / f"{mix}-ew{workers}"
    every = read_metrics(run_dir / "metrics.jsonl")
    first = next(i for i, r in enumerate(every) if r["kind"] == "train")
    rows = [r for r in every if r["kind"] == "train"]
    wall = rows[-1]["time"] - every[first - 1]["time"]
    result = {"mix": mix, "execute_workers": workers, "steps": len(rows), "wall_s": wall}
    result |= {"steps_per_hour": 3600 * len(rows) / wall, "rss_mib": usage.ru_maxrss / 1024}
    (run_dir / "bench.json").write_text(json.dumps(result))
    return result


CLUSTER = """# this machine: one embedded engine at its measured rate, 64 sandbox slots
engines: {{count: 1, tokens_per_s: measured}}
sandbox_slots: 64
workers: {{generate: 1, execute: {workers}, verify: 2}}
search: {{generate: [1], execute: [1, 2, 4, 8], verify: [2]}}
simulate: {{draw: {draw}, steps: {steps}, replicas: {replicas}, search_steps: {steps}}}
"""


def predicted(source: Path, workers: int, draw: str, steps: int, cluster_dir: Path) -> Any:
    from posttrain.plan import load_cluster, plan_run

    replicas = 1 if draw == "replay" else 200
    cluster = cluster_dir / f"cluster-{source.name}-ew{workers}-{draw}.yaml"
    cluster.write_text(CLUSTER.format(workers=workers, draw=draw, steps=steps, replicas=replicas))
    return plan_run(source, load_cluster(cluster), seed=0)


def plan_rows(out: Path, steps: int) -> list[dict[str, Any]]:
    """Plan each mix from its execute_workers=1 run, for every split (replaying the run's groups
    in order, and drawing them at random)."""
    rows = []
    for mix in MIXES:
        source = out / f"{mix}-ew1"
        for workers in SPLITS:
            measured = json.loads((out / f"{mix}-ew{workers}" / "bench.json").read_text())
            got = measured["steps_per_hour"]
            t0 = time.perf_counter()
            replay = predicted(source, workers, "replay", measured["steps"], out)
            plan_s = time.perf_counter() - t0
            boot = predicted(source, workers, "bootstrap", measured["steps"], out)
            rows.append(
                {
                    **measured,
                    "replay_steps_per_hour": replay.current.steps_per_hour,
                    "replay_error": replay.current.steps_per_hour / got - 1,
                    "bootstrap_steps_per_hour": boot.current.steps_per_hour,
                    "bootstrap_error": boot.current.steps_per_hour / got - 1,
                    "bottleneck": replay.current.bottleneck,
                    "best_split": "/".join(map(str, replay.best.workers)),
                    "plan_s": plan_s,
                }
            )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| mix | execute workers | measured steps/h | predicted (replay) | error | predicted (bootstrap) | error "
        "| bottleneck | best split | wall s | peak RSS MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mix']} | {r['execute_workers']} | {r['steps_per_hour']:.0f} | {r['replay_steps_per_hour']:.0f} "
            f"| {r['replay_error']:+.0%} | {r['bootstrap_steps_per_hour']:.0f} | {r['bootstrap_error']:+.0%} "
            f"| {r['bottleneck']} | {r['best_split']} | {r['wall_s']:.1f} "
            f"| {r['rss_mib']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        raise SystemExit(child(sys.argv[2:]))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--out", default="/tmp/posttrain-bench-planner")
    p.add_argument("--model", default=None, help="base model folder (default: the cached demo base)")
    p.add_argument("--plan-only", default=None, metavar="DIR", help="only plan the runs of this earlier output folder")
    p.add_argument("--measure-only", action="store_true", help="run the training runs, do not plan")
    args = p.parse_args()
    if args.plan_only:
        out = Path(args.plan_only)
    else:
        from async_loop import _cached_base

        model = args.model or _cached_base()
        out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
        for mix in MIXES:
            for workers in SPLITS:
                print(json.dumps(measure(mix, workers, args.steps, out, model)), flush=True)
        if args.measure_only:
            print(f"runs in {out}")
            return
    rows = plan_rows(out, args.steps)
    print(table(rows))
    worst = max(abs(r["replay_error"]) for r in rows)
    print(f"\nworst error (replay) {worst:.0%} ({'within' if worst <= 0.2 else 'NOT within'} 20%); runs in {out}")
    print(f"bench peak RSS (this process, planning included): {_self_rss():.0f} MiB")


def _self_rss() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    main()
