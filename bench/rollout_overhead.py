"""The closed loop's rollout step outside the engine, before and after, side by side in
one run: CPU per step of each phase of the demo's rollout step (draw tasks, the
pipeline around generation, generation itself, record building, the trace write, the
consumed-marks write), with the two variants taking turns at every step on the same
tasks and seeds (their rollouts are checked to be identical).

- before: every completion's execute call hops to the execute thread pool even when
  its domain declares no execute step; each trace record converts its sampling
  parameters anew.
- after (the code now): domains without an execute step skip the hop; the sampling
  parameters' trace view is built once per domain budget.

CPU time, not wall time: on a shared machine wall time mostly measures the neighbours.
The engine's CPU is measured in its own thread (thread CPU inside `generate`) and
subtracted, so "outside" is what the step costs around generation and verification.

    OMP_NUM_THREADS=1 .venv/bin/python bench/rollout_overhead.py [--steps 10] [--model DIR]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import statistics
import tempfile
import time
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")

PHASES = ("draw", "pipeline", "engine", "records", "trace write", "mark consumed")


class EngineClock:
    """Wraps an engine's generate and sums the CPU its thread spends inside it."""

    def __init__(self, engine: Any) -> None:
        self.cpu = 0.0
        inner = engine.generate

        def generate(requests: Any) -> Any:
            t0 = time.thread_time()
            try:
                return inner(requests)
            finally:
                self.cpu += time.thread_time() - t0

        engine.generate = generate


def legacy_record(r: Any, params: Any, budgets: Any) -> Any:
    """The trace record as the loop built it before: sampling params converted per record."""
    from posttrain import loop
    from posttrain.trace import RolloutRecord
    from posttrain.types import to_dict

    if budgets and r.task.domain in budgets:
        params = dataclasses.replace(params, max_tokens=budgets[r.task.domain].tokens)
    new = loop._record(r, params, None)
    return dataclasses.replace(new, sampling=to_dict(params)) if isinstance(new, RolloutRecord) else new


def variant(name: str, cfg: Any, model_dir: str | None, out: str) -> dict[str, Any]:
    import torch

    from posttrain.engine.sync import make_engine
    from posttrain.model.arch import load_model, random_model
    from posttrain.pipeline.budget import domain_budgets
    from posttrain.pipeline.step import StepRollouts, make_workers
    from posttrain.pipeline.workers import DomainExecute
    from posttrain.tasks.pool import TaskPool
    from posttrain.trace import TraceStore
    from posttrain.types import SamplingParams

    torch.manual_seed(0)
    model, tok = load_model(model_dir) if model_dir else random_model("tiny", seed=0)
    engine = make_engine(cfg.engine, model, tok, cfg.run.seed)
    clock = EngineClock(engine)
    pool = TaskPool(cfg.tasks, seed=cfg.run.seed)
    budgets = domain_budgets(pool.names, pool.specs, cfg.rollout.max_tokens)
    params = SamplingParams(max_tokens=max(b.tokens for b in budgets.values()), temperature=cfg.rollout.temperature,
                            top_p=cfg.rollout.top_p, n=cfg.rollout.group_size)
    execute = DomainExecute(cfg.sandbox.pool_config(), cfg.sandbox.max_memory_mb, cfg.sandbox.max_wall_s,
                            {n: b.seconds for n, b in budgets.items()})
    if name == "before":
        domain_execute = execute
        execute = lambda task, completion: domain_execute(task, completion)  # noqa: E731  (not a DomainExecute)
    workers = make_workers(cfg.runtime, cfg.pipeline, engine, execute=execute)
    rollouts = StepRollouts(cfg.pipeline, workers, pool, cfg.run.seed, None, True, budgets)
    trace = TraceStore(os.path.join(out, f"{name}.db"))
    return {"name": name, "pool": pool, "rollouts": rollouts, "trace": trace, "params": params,
            "budgets": budgets, "clock": clock, "times": {p: [] for p in PHASES}, "seen": []}


def step(v: dict[str, Any], number: int) -> None:
    from posttrain import loop
    from posttrain.trainer.batch import RolloutLink

    t, clock, cpu = v["times"], v["clock"], time.process_time
    c0 = cpu()
    tasks = v["pool"].draw(32)
    c1, e0 = cpu(), clock.cpu
    groups, _ = v["rollouts"].sample(tasks, v["params"], number)
    c2, e1 = cpu(), clock.cpu
    build = legacy_record if v["name"] == "before" else loop._record
    records = [build(r, v["params"], v["budgets"]) for g in groups for r in g]
    c3 = cpu()
    v["trace"].write_rollouts(records)
    c4 = cpu()
    v["trace"].mark_consumed(number, {rec.id: RolloutLink(0.0, 1.0, 0.0) for rec in records})
    c5 = cpu()
    for r in (r for g in groups for r in g if r.reward is not None):
        v["pool"].observe(r.task, r.reward)
    c6 = cpu()
    for phase, seconds in zip(PHASES, (c1 - c0 + c6 - c5, c2 - c1 - (e1 - e0), e1 - e0, c3 - c2, c4 - c3, c5 - c4)):
        t[phase].append(seconds)
    v["seen"].append([(r.completion.token_ids, r.reward) for g in groups for r in g])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--model", default=None, help="a model directory (default: the tiny preset, random weights)")
    args = ap.parse_args()
    import torch

    from posttrain.configs import load_config

    torch.set_num_threads(1)
    cfg = load_config(os.path.join(os.path.dirname(__file__), "..", "configs", "default.yaml"), [])
    with tempfile.TemporaryDirectory() as out:
        variants = [variant(name, cfg, args.model, out) for name in ("before", "after")]
        for number in range(args.steps + 1):  # step 0 warms up
            for v in variants:
                step(v, number)
        for v in variants:
            v["rollouts"].close()
            v["trace"].close()
    same = variants[0]["seen"] == variants[1]["seen"]
    med = {v["name"]: {p: statistics.median(v["times"][p][1:]) * 1e3 for p in PHASES} for v in variants}
    print(f"demo rollout step (32 prompts x {cfg.rollout.group_size}), median CPU ms per step over {args.steps} "
          f"steps; identical rollouts: {same}")
    print(f"| phase | {' | '.join(med)} | after/before |")
    print("|---|---:|---:|---:|")
    for p in PHASES:
        b, a = med["before"][p], med["after"][p]
        print(f"| {p} | {b:.1f} | {a:.1f} | {a / b if b else float('nan'):.2f} |")
    outside = {n: sum(m[p] for p in PHASES if p != "engine") for n, m in med.items()}
    print(f"| outside the engine | {outside['before']:.1f} | {outside['after']:.1f} | "
          f"{outside['after'] / outside['before']:.2f} |")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
