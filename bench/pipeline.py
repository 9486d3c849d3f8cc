"""Pipeline vs synchronous rollout on one workload, side by side in one run.

What is real: the HF engine generating on the CPU (the tiny embedded model),
the domains' verifiers, the pipeline's queues, workers, scheduler and
TaskGroup. What is simulated: execution time. Each group's execution sleeps
`short_ms` (9 tasks in 10) or `factor` x `short_ms` (1 in 10, chosen by a
hash of the task id), standing in for sandboxed test runs with a heavy tail.

Synchronous: per step of `prompts` groups, generate all, then execute all
(`execute_workers` threads), then verify all (`verify_workers` threads), as
the closed loop did. Pipeline: the same tasks through generate -> execute ->
verify over bounded queues, with the same worker counts and the same seeds
(the rollouts are identical: checked). Ideal bound: the busiest stage's
total work (measured in the synchronous run) divided by its workers.

    .venv/bin/python bench/pipeline.py [--model DIR] [--steps 8] [--prompts 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")


LONG_DOMAIN = "mul"


def simulated_execute(short_ms: float, factor: float):
    """Sleeps a group's simulated execution time once per group (on its first sample):
    `short_ms`, or `factor` x `short_ms` for the long domain."""
    import threading

    seen: set[tuple[str, int]] = set()
    lock = threading.Lock()

    def run(task, completion):
        with lock:
            first = (task.id, 0) not in seen
            seen.add((task.id, 0))
        if first:
            time.sleep(short_ms * (factor if task.domain == LONG_DOMAIN else 1.0) / 1000.0)
        return None

    return run


def workload(steps: int, prompts: int):
    """Five domains; the long one is drawn 1 time in 10."""
    from posttrain.configs.tasks import TasksConfig
    from posttrain.tasks.pool import TaskPool

    domains = {d: {"difficulty": 1, "weight": 2.25} for d in ("add", "sub", "reverse", "sort")}
    domains[LONG_DOMAIN] = {"difficulty": 1, "weight": 1.0}
    pool = TaskPool(TasksConfig.model_validate({"domains": domains}), seed=0)
    return [pool.draw(prompts) for _ in range(steps)]


SEED = 1234


def run_sync(engine, steps, params, execute, cfg):
    """Per step: generate all, execute all, verify all. Returns (wall, stage totals, rewards)."""
    import dataclasses

    from posttrain.domains.base import stable_hash
    from posttrain.pipeline.workers import verify_group
    from posttrain.types import Episode, GenerationRequest

    totals = {"generate": 0.0, "execute": 0.0, "verify": 0.0}
    rewards = []
    ex, vx = ThreadPoolExecutor(cfg.execute_workers), ThreadPoolExecutor(cfg.verify_workers)

    def timed(fn, *a):
        t0 = time.perf_counter()
        out = fn(*a)
        return time.perf_counter() - t0, out

    k = 0
    t0 = time.perf_counter()
    for tasks in steps:
        reqs = []
        for t in tasks:  # the pipeline's seeding: (seed, group id, attempt)
            seeded = dataclasses.replace(params, seed=stable_hash("group", SEED, str(k), 0))
            reqs.append(GenerationRequest(engine.encode_chat(t.prompt), seeded, str(k)))
            k += 1
        took, groups = timed(engine.generate, reqs)
        totals["generate"] += took
        order = sorted(
            range(len(tasks)), key=lambda i: tasks[i].domain != LONG_DOMAIN
        )  # long first, as the pipeline does
        runs = list(
            ex.map(
                lambda i, tasks=tasks, groups=groups: timed(lambda: tuple(execute(tasks[i], c) for c in groups[i])),
                order,
            )
        )
        totals["execute"] += sum(r[0] for r in runs)
        eps = [[Episode(c.text, finish_reason=c.finish_reason) for c in g] for g in groups]
        verdicts = list(vx.map(lambda te: timed(verify_group, te[0], te[1]), zip(tasks, eps)))
        totals["verify"] += sum(v[0] for v in verdicts)
        rewards += [tuple(x.score.value for x in v[1]) for v in verdicts]
    wall = time.perf_counter() - t0
    ex.shutdown()
    vx.shutdown()
    return wall, totals, rewards


def run_pipeline(engine, steps, params, execute, cfg):
    """The whole workload through one pipeline (same workers, same seeds)."""
    from posttrain.pipeline import EmbeddedWorkers, Pipeline, Scheduler

    tasks = [t for step in steps for t in step]
    names = sorted({t.domain for t in tasks})
    sched = Scheduler(cfg, {n: 1.0 for n in names}, {n: "long" if n == LONG_DOMAIN else "short" for n in names})

    async def go():
        t0 = time.perf_counter()
        async with Pipeline(
            cfg, EmbeddedWorkers(engine, execute, execute_threads=cfg.execute_workers), params, sched, seed=SEED
        ) as pipe:
            results = await pipe.run_groups(tasks)
            stats = pipe.stats()
        return time.perf_counter() - t0, stats, results

    wall, stats, results = asyncio.run(go())
    return wall, stats, [tuple(r.reward for r in g.rollouts) for g in results]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", default=None, help="a model directory (default: the embedded tiny base, built if missing)"
    )
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--short-ms", type=float, default=40.0, help="simulated execution time of a short group")
    ap.add_argument("--factor", type=float, default=20.0, help="how much longer 1 task in 10 executes")
    ap.add_argument("--execute-workers", type=int, default=16)
    ap.add_argument("--verify-workers", type=int, default=2)
    args = ap.parse_args(argv)

    import torch

    from posttrain.configs.base import BaseConfig
    from posttrain.configs.pipeline import PipelineConfig
    from posttrain.engine.hf import HFEngine
    from posttrain.model.arch import load_model
    from posttrain.model.pretrain import ensure_base
    from posttrain.types import SamplingParams

    torch.set_num_threads(1)
    model, tok = load_model(args.model or ensure_base(BaseConfig(), progress=False), device="cpu")
    engine = HFEngine(model, tok, device="cpu", seed=0)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, n=args.group_size)
    steps = workload(args.steps, args.prompts)
    total = sum(map(len, steps))
    cfg = PipelineConfig(
        execute_workers=args.execute_workers,
        verify_workers=args.verify_workers,
        generate_batch=args.prompts,
        max_inflight=4 * args.prompts,
        min_inflight=args.prompts,
        long_slots=args.prompts // 2,
        queue_size=2 * args.prompts,
    )
    execute = simulated_execute(args.short_ms, args.factor)
    engine.generate([])  # warm up
    sync_wall, totals, sync_rewards = run_sync(engine, steps, params, execute, cfg)
    execute = simulated_execute(args.short_ms, args.factor)  # a fresh one: each run pays every group's time
    pipe_wall, pstats, pipe_rewards = run_pipeline(engine, steps, params, execute, cfg)
    if sorted(sync_rewards) != sorted(pipe_rewards):
        print("warning: the two runs scored different rollouts", file=sys.stderr)
    ideal = max(totals["generate"] / 1, totals["execute"] / cfg.execute_workers, totals["verify"] / cfg.verify_workers)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    busiest = max(
        ("generate", totals["generate"]),
        ("execute", totals["execute"] / cfg.execute_workers),
        ("verify", totals["verify"] / cfg.verify_workers),
        key=lambda kv: kv[1],
    )[0]
    util = {st.name: st for st in pstats.stages}
    print(
        f"workload: {total} groups x {args.group_size} samples over {args.steps} steps; "
        f"execution simulated: {args.short_ms:.0f} ms per group, x{args.factor:g} for {LONG_DOMAIN} (1 task in 10)"
    )
    print(
        f"stage work in the synchronous run (s): generate {totals['generate']:.2f}, execute {totals['execute']:.2f} "
        f"over {cfg.execute_workers} workers, verify {totals['verify']:.2f} over {cfg.verify_workers}"
    )
    print(f"ideal bound ({busiest} stage): {ideal:.2f} s")
    print(f"synchronous wall: {sync_wall:.2f} s")
    print(f"pipeline wall:    {pipe_wall:.2f} s")
    print(f"speed-up (sync / pipeline): {sync_wall / pipe_wall:.2f}x  (target >= 2x)")
    print(f"pipeline / ideal bound:     {pipe_wall / ideal:.2f}x  (target <= 1.25x)")
    print(
        "pipeline stages: "
        + ", ".join(
            f"{n} {util[n].items} groups, p50 {util[n].p50_s * 1000:.0f} ms, p99 {util[n].p99_s * 1000:.0f} ms, "
            f"idle {100 * (1 - util[n].utilisation):.0f}%"
            for n in ("generate", "execute", "verify")
        )
    )
    print("max queue depths: " + ", ".join(f"{q.name} {q.max_depth}" for q in pstats.queues))
    print(f"same rollouts scored in both runs: {sorted(sync_rewards) == sorted(pipe_rewards)}")
    print(f"peak RSS: {rss:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
