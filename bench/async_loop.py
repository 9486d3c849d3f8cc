"""`posttrain train` synchronous (pipeline.mode sync) against asynchronous (pipeline.mode async,
max_staleness k = 1, 2, 4) on one workload with heavy-tailed real execution, side by side in one
run: the wall time to the same number of trained samples, the held-out curve at equal trained
samples (with its 95% interval), and the peak RSS of each run's process.

The workload, `slowadd`: the demo's addition questions (difficulty 1, the base model's own
prompt format), whose verification runs a program in the sandbox: the program sleeps for the
task's execution time, then checks the model's answer (extracted as the built-in `add`
extracts it, so the cheat probes pass as they do for `add`). Execution times are heavy-tailed
and fixed per task (Pareto, scale 0.5 s, shape 1, capped at 10 s: median 1 s, mean 2 s, one
task in ten over 5 s, one in twenty at the cap); the held-out split runs the same check with
no sleep. Every run trains from the same cached base with the same seed, dynamic sampling off,
so each step trains every sample of its batch. The runs evaluate only before and after
training (`eval.every_steps=0`: an evaluation inside the loop would let the async run's
pipeline work while the sync run's waits); the curve's inner points are the checkpoints of
steps/4, steps/2 and 3 steps/4, evaluated afterwards on the run's own held-out set.

    .venv/bin/python bench/async_loop.py                 # ~20 min on 2 shared cores
    .venv/bin/python bench/async_loop.py --steps 6 --ks 1   # a quick look

Each run is a child process (`posttrain train` through `posttrain.cli.main`, after registering
`slowadd`); its peak RSS is the child's own (os.wait4), not counting its sandbox workers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCALE_S, SHAPE, CAP_S = 0.5, 1.0, 10.0

CHECK = """
import json, time
spec = json.load(open("spec.json"))
time.sleep(spec["sleep_s"])
print("PASS" if open("answer.txt").read() == spec["answer"] else "FAIL")
"""


def exec_seconds(task_id: str) -> float:
    """The task's execution time: Pareto(SCALE_S, SHAPE) capped at CAP_S, fixed by its id."""
    u = random.Random(f"slowadd-exec:{task_id}").random()
    return min(CAP_S, SCALE_S / (1.0 - u) ** (1.0 / SHAPE))


def register() -> None:
    """Register the `slowadd` domain in this process (a bench workload, not a built-in)."""
    from posttrain import sandbox
    from posttrain.domains.add import Add
    from posttrain.domains.base import extract_answer
    from posttrain.domains.registry import register as add_domain
    from posttrain.sandbox import ExecRequest, Limits
    from posttrain.types import Score

    class SlowCheck:
        name, version = "slowadd_check", "1"

        def execute(self, task: Any, completion: str, run: Any = None) -> Any:
            sleep_s = exec_seconds(task.id) if task.meta.split == "train" else 0.0
            spec = json.dumps({"sleep_s": sleep_s, "answer": str(task.reference)})
            req = ExecRequest(
                files={"check.py": CHECK, "spec.json": spec, "answer.txt": extract_answer(completion)},
                python_main="check.py",
                limits=Limits(wall_s=CAP_S + 10, cpu_s=10),
            )
            return sandbox.raise_for_infra(run(req) if run else sandbox.run(req, domain="slowadd"))

        def score(self, task: Any, episode: Any) -> Score:
            res = episode.exec_result if episode.exec_result is not None else self.execute(task, episode.completion)
            ok = res.stdout.decode(errors="replace").strip() == "PASS"
            return Score(float(ok), {"outcome": float(ok)}, ok, "" if ok else "wrong sum")

    class SlowAdd(Add):
        name = "slowadd"
        description = "a+b checked by a sandboxed program that runs for a heavy-tailed time"
        verifier = SlowCheck()

    add_domain(SlowAdd())


def overrides(mode: str, k: int, steps: int, out: Path, model: str) -> list[str]:
    run = "sync" if mode == "sync" else f"async-k{k}"
    return [
        f"model.path={model}",
        f"run.out_dir={out}",
        f"run.name={run}",
        f"run.steps={steps}",
        "run.threads=1",
        "run.seed=0",
        f"run.checkpoint_every={max(1, steps // 4)}",
        "run.progress=false",
        "monitor.report=false",
        "tasks.domains={slowadd: {difficulty: 1}}",
        "rollout.prompts_per_step=8",
        "rollout.group_size=4",
        "rollout.dynamic_sampling=false",
        "eval.tasks_per_domain=100",
        "eval.every_steps=0",
        "eval.samples=0",
        "eval.above_tasks=0",
        "sandbox.workers=64",
        "pipeline.execute_workers=64",
        "trainer.keep_checkpoints=8",
        f"pipeline.mode={mode}",
        f"pipeline.max_staleness={0 if mode == 'sync' else k}",
    ]


def child(argv: list[str]) -> int:
    """`--child train OVERRIDES...` or `--child eval RUN_DIR`: with `slowadd` registered."""
    register()
    from posttrain.cli import main

    if argv[0] == "train":
        return main(["train", *argv[1:]])
    run_dir = Path(argv[1])
    for ckpt in sorted((run_dir / "checkpoints").glob("step_*")):
        code = main(["eval", "--run", str(run_dir), "--model", str(ckpt), "--json", str(ckpt / "heldout_eval.json")])
        if code:
            return code
    return 0


def run_one(mode: str, k: int, steps: int, out: Path, model: str) -> dict[str, Any]:
    args = [sys.executable, __file__, "--child", "train", *overrides(mode, k, steps, out, model)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    log = proc.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    total_s = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{mode} k={k} failed ({proc.returncode}):\n{log[-4000:]}")
    run_dir = out / ("sync" if mode == "sync" else f"async-k{k}")
    evals = subprocess.run([sys.executable, __file__, "--child", "eval", str(run_dir)], env=env, capture_output=True)
    if evals.returncode:
        tail = evals.stdout.decode()[-3000:] + evals.stderr.decode()[-3000:]
        raise SystemExit(f"evaluating {run_dir} failed:\n{tail}")
    return summarise(run_dir, mode, k, total_s, usage.ru_maxrss / 1024)


def summarise(run_dir: Path, mode: str, k: int, total_s: float, rss_mib: float) -> dict[str, Any]:
    from posttrain.metrics_log import read_metrics
    from posttrain.trace import TraceStore

    rows = read_metrics(run_dir / "metrics.jsonl", "train")
    store = TraceStore(run_dir / "trace.db")
    trained_by_step: dict[int, int] = {}
    for r in store.recent(1_000_000):
        if r["train_step"] is not None:
            trained_by_step[r["train_step"]] = trained_by_step.get(r["train_step"], 0) + 1
    cum, curve = 0, []
    every = read_metrics(run_dir / "metrics.jsonl")
    first = next(i for i, r in enumerate(every) if r["kind"] == "train")
    start = every[first - 1]["time"]  # the last record before the first step: the evaluation before training
    for r in rows:
        cum += trained_by_step.get(r["step"], 0)
        curve.append((cum, r["time"] - start))
    ev = json.loads((run_dir / "eval.json").read_text())
    inner = []
    for ckpt in sorted((run_dir / "checkpoints").glob("step_*"))[:-1]:  # the last one is the final weights
        inner.append((int(ckpt.name.split("_")[1]), json.loads((ckpt / "heldout_eval.json").read_text())))
    history = [(0, ev["before"]), *inner, (rows[-1]["step"], ev["after"])]
    points = [(step, t["domains"]["slowadd"]["accuracy"], t["domains"]["slowadd"]["ci"]) for step, t in history]
    stale = [r.get("pipe_staleness_max", 0) for r in rows]
    return {
        "mode": mode,
        "k": k,
        "steps": len(rows),
        "curve": curve,
        "eval": points,
        "staleness_max": max(stale),
        "staleness_mean": sum(r.get("pipe_staleness_mean", 0) for r in rows) / len(rows),
        "waited_s": sum(r.get("pipe_wait_s", 0) for r in rows),
        "dropped": sum(r.get("stale_dropped", 0) for r in rows),
        "requeued": sum(r.get("stale_requeued", 0) for r in rows),
        "ratio_max": max(r.get("ratio_max", 1.0) for r in rows),
        "clip_frac_mean": sum(r.get("clip_frac", 0.0) for r in rows) / len(rows),
        "total_s": total_s,
        "rss_mib": rss_mib,
    }


def time_to(curve: list[tuple[int, float]], samples: int) -> float | None:
    """Seconds from the first step's start until `samples` samples were trained."""
    return next((t for n, t in curve if n >= samples), None)


def table(results: list[dict[str, Any]]) -> str:
    sync = results[0]
    target = sync["curve"][-1][0]
    base = time_to(sync["curve"], target)
    lines = [
        f"trained samples compared: {target} (the sync run's total)",
        "",
        "| run | wall s to N trained | speed-up | staleness max / mean | trainer waited s | "
        "re-queued / dropped | ratio max | clip frac | peak RSS MiB | process s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        t = time_to(r["curve"], target)
        name = "sync" if r["mode"] == "sync" else f"async k={r['k']}"
        speed = f"{base / t:.2f}x" if t and base else "n/a"
        lines.append(
            f"| {name} | {t:.1f} | {speed} | {r['staleness_max']:.0f} / {r['staleness_mean']:.2f} | "
            f"{r['waited_s']:.1f} | {r['requeued']:.0f} / {r['dropped']:.0f} | {r['ratio_max']:.3f} | "
            f"{r['clip_frac_mean']:.4f} | {r['rss_mib']:.0f} | {r['total_s']:.0f} |"
            if t is not None
            else f"| {name} | did not reach {target} | | | | | | | {r['rss_mib']:.0f} | {r['total_s']:.0f} |"
        )
    lines += ["", "Held-out accuracy (greedy, the run's held-out set, 95% Wilson interval) after each step:", ""]
    steps = [s for s, *_ in sync["eval"]]
    lines.append("| step | " + " | ".join("sync" if r["mode"] == "sync" else f"k={r['k']}" for r in results) + " |")
    lines.append("|---:|" + "---:|" * len(results))
    for i, s in enumerate(steps):
        cells = []
        for r in results:
            _, acc, ci = r["eval"][i] if i < len(r["eval"]) else (s, None, None)
            cells.append(f"{acc:.2f} [{ci[0]:.2f}, {ci[1]:.2f}]" if acc is not None and ci else "n/a")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def profile(run_dir: Path, k: int) -> dict[str, Any]:
    """Where one run's time went, from its metrics and trace: the trainer's wait for finished
    groups, the rest of each step (training, the push, the trace, the monitor: `c`), the stages'
    busy shares, each admission cohort's lifetime (the groups admitted at loop step a: the
    largest admission-to-finish time, `total_s`, of their rollouts), and the lower bound on the
    wall time that those lifetimes set under a staleness bound k counted from admission: the
    cohort of take a must be finished before take a + k + 1 can train, so the takes
    a, a + k + 1, a + 2(k + 1), ... are at least a lifetime plus a step's `c` apart, and the run
    lasts at least the largest sum of (lifetime + c) over one residue class of a mod (k + 1)
    (for k = 0, sync, every step: the sum over all)."""
    import sqlite3

    from posttrain.metrics_log import read_metrics

    rows = read_metrics(run_dir / "metrics.jsonl", "train")
    every = read_metrics(run_dir / "metrics.jsonl")
    first = next(i for i, r in enumerate(every) if r["kind"] == "train")
    times = [every[first - 1]["time"], *(r["time"] for r in rows)]
    walls = [b - a for a, b in zip(times, times[1:])]
    waits = [r.get("pipe_wait_s", r["rollout_s"]) for r in rows]  # sync: the whole sampling is the wait
    rest = [w - x for w, x in zip(walls, waits)]
    c = sum(rest) / len(rest)
    con = sqlite3.connect(run_dir / "trace.db")
    life: dict[int, float] = {}
    sleep: dict[int, float] = {}  # the cohort's longest programmed sleep alone (no generation, no overhead)
    for group, task, timings in con.execute("SELECT group_id, task_id, timings FROM rollouts"):
        step = int(group.split(":")[0])
        life[step] = max(life.get(step, 0.0), json.loads(timings).get("total_s", 0.0))
        sleep[step] = max(sleep.get(step, 0.0), exec_seconds(task))
    con.close()
    lifetimes = [life.get(a, 0.0) for a in range(1, len(rows) + 1)]
    sleeps = [sleep.get(a, 0.0) for a in range(1, len(rows) + 1)]
    bound = max(sum(m + c for m in lifetimes[j :: k + 1]) for j in range(k + 1))
    sleep_bound = max(sum(sleeps[j :: k + 1]) for j in range(k + 1))
    last = rows[-1]
    return {
        "wall_s": sum(walls),
        "wait_share": sum(waits) / sum(walls),
        "rest_mean_s": c,
        "generate_busy": 1 - last.get("generate_idle_share", 1.0),
        "execute_busy": 1 - last.get("execute_idle_share", 1.0),
        "execute_p50_s": last.get("execute_p50_s"),
        "lifetime_mean_s": sum(lifetimes) / len(lifetimes),
        "bound_s": bound,
        "sleep_bound_s": sleep_bound,
    }


def profile_table(results: list[dict[str, Any]], out: Path) -> str:
    lines = [
        "| run | wall s | trainer waited | rest of a step s | generate busy | execute busy | execute p50 s "
        "| cohort lifetime mean s | lower bound s | wall / bound | sleeps-only bound s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        name = "sync" if r["mode"] == "sync" else f"async-k{r['k']}"
        p = profile(out / name, r["k"])
        lines.append(
            f"| {name} | {p['wall_s']:.1f} | {p['wait_share']:.0%} | {p['rest_mean_s']:.2f} | {p['generate_busy']:.1%} "
            f"| {p['execute_busy']:.1%} | {p['execute_p50_s']:.2f} | {p['lifetime_mean_s']:.2f} | {p['bound_s']:.1f} "
            f"| {p['wall_s'] / p['bound_s']:.2f} | {p['sleep_bound_s']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        raise SystemExit(child(sys.argv[2:]))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--ks", type=int, nargs="*", default=[1, 2, 4])
    p.add_argument("--out", default="/tmp/posttrain-bench-async")
    p.add_argument("--model", default=None, help="base model folder (default: the cached demo base)")
    p.add_argument("--json", default=None, help="also write the raw results here")
    p.add_argument("--profile", default=None, help="only profile the runs of this earlier output folder")
    args = p.parse_args()
    if args.profile:
        done = [{"mode": "sync", "k": 0}, *({"mode": "async", "k": k} for k in args.ks)]
        print(profile_table(done, Path(args.profile)))
        return
    model = args.model or _cached_base()
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    results = [run_one("sync", 0, args.steps, out, model)]
    for k in args.ks:
        results.append(run_one("async", k, args.steps, out, model))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    print(table(results))
    print("\nWhere the time went (bench/async_loop.py profile):\n")
    print(profile_table(results, out))


def _cached_base() -> str:
    """The demo's base model (configs/default.yaml's `base`), built once and cached."""
    from posttrain.configs import load_config
    from posttrain.model.pretrain import ensure_base

    return str(ensure_base(load_config(str(HERE.parent / "configs/default.yaml"), []).base, progress=False))


if __name__ == "__main__":
    main()
