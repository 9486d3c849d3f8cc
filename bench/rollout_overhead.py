"""The closed loop's rollout step outside the engine, before and after, side by side in
one run: CPU per step of each phase of the demo's rollout step (draw tasks, the
pipeline around generation, generation itself, record building, the trace write, the
consumed-marks write), the variants taking turns at every step on the same tasks and
seeds (their rollouts are checked to be identical).

- before: the staged asyncio pipeline as it was (a fresh event loop and Pipeline per
  step through `asyncio.run`, the feeder and the result collector polling every 50 ms,
  one thread hop per group to verify), trace rows encoded with one `json.dumps` (and
  so one JSONEncoder) per JSON column.
- staged: the staged pipeline now (`pipeline.direct=false`): one event loop kept across
  steps, the feeder and the collector woken by events, a cheap verifier called in the
  event loop's thread (no hop); trace rows as now.
- after (the code now, the default): the direct path (pipeline/direct.py: generate,
  then verify inline, no event loop, queues or thread hops), taken because every demo
  domain is single-turn, executes nothing and has a cheap verifier; trace rows encoded
  with one shared encoder.

CPU time, not wall time: on a shared machine wall time mostly measures the neighbours.
Every thread counts (`time.process_time`); the engine's CPU is measured in the thread
that runs it (thread CPU inside `generate`) and subtracted, so "outside" is what the
step costs around generation.

With `--loop N`, the same three variants also run the whole training loop (`loop.train`
on configs/default.yaml, N steps, a small held-out set, no periodic evaluation or
checkpoint), one after another in this process, and the table is per training step: the
loop's own training CPU count (`train_cpu_s`, every thread), the engine's and the train
step's CPU, and the rest (the rollout step around the engine, trace, monitor, metrics);
the three runs' trace rows and final weights are checked identical.

With `--phases N` (alone), the demo's training loop part by part against a git revision
(`--rev`, default main): that revision's src/ and configs/ (`git archive`) and this tree's each
run N steps in their own process, `--rounds` times, alternately; every part's CPU per step is
counted exclusively (the process's CPU inside the wrapped call less the wrapped calls it makes:
task pool draw and observe, prompt encoding, the engine, the rest of the pipeline, trace
records, trace write, consumed marks, the train step, the monitor's signals, its KL forward
and the rest of it, the metrics log, the rest of the loop step); the two trees' trace rows
(group, task, prompt, completion, reward, passed, train step, advantage, ratio, clip share,
sampling, parts) and final weights are checked identical.

    OMP_NUM_THREADS=1 .venv/bin/python bench/rollout_overhead.py [--steps 10] [--model DIR] [--loop 80]
    OMP_NUM_THREADS=1 .venv/bin/python bench/rollout_overhead.py --phases 40 --rounds 3 [--rev main] [--model DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from common import quiet_run  # bench/common.py: this script runs with bench/ first on sys.path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")

PHASES = ("draw", "pipeline", "engine", "records", "trace write", "mark consumed")
VARIANTS = ("before", "staged", "after")


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


def legacy_pipeline() -> type:
    """The staged pipeline's feeder and result collector as they were (50 ms polls), and its
    verification (a thread hop per group, cheap verifier or not)."""
    from posttrain.pipeline.core import Pipeline

    class LegacyPipeline(Pipeline):
        def _cheap(self, domain: str) -> bool:
            return False  # every group's verification hopped to the verify thread pool

        async def _feeder(self) -> None:
            while not self._closing:
                task = None
                if self._room() and self._pending:
                    self._drop_paused()
                    task = self._next_pending()
                if task is None:
                    self._changed.clear()
                    try:
                        await asyncio.wait_for(self._changed.wait(), 0.05)
                    except TimeoutError:
                        pass
                    continue
                await self._admit(*task)

        async def run_groups(self, tasks: Sequence[Any], prefix: str | None = None) -> list[Any]:
            seqs = [next(self._seq) for _ in tasks]
            order = sorted(range(len(tasks)), key=lambda i: (self.scheduler.tier(tasks[i].domain) != "long", i))
            self._pending.extend((seqs[i], tasks[i]) for i in order)
            self._changed.set()
            wanted, got = set(seqs), {}
            while wanted - set(got) - set(self._skipped):
                res = await self._next_result()
                if res is not None:
                    got[res.seq] = res
            return [got.get(s) for s in seqs]

        async def _next_result(self) -> Any:
            get = asyncio.ensure_future(self.results.get())
            try:
                done, _ = await asyncio.wait([get], timeout=0.05)
            finally:
                if not get.done():
                    get.cancel()
            return get.result() if get in done and not get.cancelled() else None

    return LegacyPipeline


def legacy_sample(rollouts: Any, tasks: list[Any], params: Any, step: int) -> Any:
    """StepRollouts.sample as it was: `asyncio.run` of a fresh LegacyPipeline per step."""
    from posttrain.domains.base import stable_hash

    async def rounds() -> Any:
        groups: list[Any] = []
        async with legacy_pipeline()(
            rollouts.config,
            rollouts.workers,
            params,
            rollouts.scheduler,
            group_prefix=f"{step}:",
            seed=stable_hash("rollout", rollouts.seed, step),
            budgets=rollouts.budgets,
        ) as pipe:
            todo = tasks
            for round_ in range(rollouts.config.replace_rounds + 1):
                todo = rollouts._keep(groups, await pipe.run_groups(todo), round_)
                if not todo:
                    break
            stats = pipe.stats().flat()
        return groups, rollouts._step_stats(stats)

    return asyncio.run(rounds())


def legacy_step(rollouts: Any, tasks: Sequence[Any], params: Any, step: int) -> Any:
    """StepRollouts.sample as it was, in the loop (its per-step `pipeline` trace event included)."""
    groups, stats = legacy_sample(rollouts, list(tasks), params, step)
    if rollouts._events is not None:
        rollouts._events("pipeline", f"rollout step {step}", None, {"step": step, **stats})
    return groups, stats


def legacy_write(trace: Any, records: Sequence[Any]) -> None:
    """TraceStore.write_rollouts as it was: one json.dumps (one JSONEncoder) per JSON column."""
    from posttrain import trace as tr

    def row(rec: Any) -> tuple:
        out = []
        for col in tr._COLUMNS:
            value = getattr(rec, col)
            if col in tr._JSON_COLUMNS:
                value = json.dumps(value, default=str) if value is not None or col not in tr._NULLABLE_JSON else None
            elif col == "passed" and value is not None:
                value = int(value)
            out.append(value)
        return tuple(out)

    marks = ",".join("?" * len(tr._COLUMNS))
    with trace._db:
        trace._db.executemany(
            f"INSERT INTO rollouts ({','.join(tr._COLUMNS)}) VALUES ({marks})", [row(r) for r in records]
        )


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
    params = SamplingParams(
        max_tokens=max(b.tokens for b in budgets.values()),
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        n=cfg.rollout.group_size,
    )
    execute = DomainExecute(
        cfg.sandbox.pool_config(),
        cfg.sandbox.max_memory_mb,
        cfg.sandbox.max_wall_s,
        {n: b.seconds for n, b in budgets.items()},
    )
    pipeline = cfg.pipeline.model_copy(update={"direct": name == "after"})
    workers = make_workers(cfg.runtime, pipeline, engine, execute=execute)
    rollouts = StepRollouts(pipeline, workers, pool, cfg.run.seed, None, True, budgets)
    assert rollouts.direct is (name == "after"), f"{name}: the demo config should take the direct path"
    trace = TraceStore(os.path.join(out, f"{name}.db"))
    return {
        "name": name,
        "pool": pool,
        "rollouts": rollouts,
        "trace": trace,
        "params": params,
        "budgets": budgets,
        "clock": clock,
        "times": {p: [] for p in PHASES},
        "seen": [],
    }


def step(v: dict[str, Any], number: int) -> None:
    from posttrain.domains.registry import verifier_label
    from posttrain.trace.rows import rollout_record
    from posttrain.trainer.batch import RolloutLink

    t, clock, cpu = v["times"], v["clock"], time.process_time
    c0 = cpu()
    tasks = v["pool"].draw(32)
    c1, e0 = cpu(), clock.cpu
    if v["name"] == "before":
        groups, _ = legacy_sample(v["rollouts"], tasks, v["params"], number)
    else:
        groups, _ = v["rollouts"].sample(tasks, v["params"], number)
    c2, e1 = cpu(), clock.cpu
    records = [rollout_record(r, v["params"], verifier_label, v["budgets"]) for g in groups for r in g]
    c3 = cpu()
    if v["name"] == "before":
        legacy_write(v["trace"], records)
    else:
        v["trace"].write_rollouts(records)
    c4 = cpu()
    v["trace"].mark_consumed(number, {rec.id: RolloutLink(0.0, 1.0, 0.0) for rec in records})
    c5 = cpu()
    for r in (r for g in groups for r in g if r.reward is not None):
        v["pool"].observe(r.task, r.reward)
    c6 = cpu()
    for phase, seconds in zip(PHASES, (c1 - c0 + c6 - c5, c2 - c1 - (e1 - e0), e1 - e0, c3 - c2, c4 - c3, c5 - c4)):
        t[phase].append(seconds)
    v["seen"].append([(r.group_id, r.completion.token_ids, r.reward, r.error_kind) for g in groups for r in g])


def loop_variant(name: str, steps: int, out: str) -> dict[str, Any]:
    """One training run of `name` (before / staged / after): CPU per step by part."""
    from posttrain.configs import load_config
    from posttrain.engine.hf import HFEngine
    from posttrain.loop import train
    from posttrain.monitor.budget import CpuBudget
    from posttrain.pipeline.step import StepRollouts
    from posttrain.trace import TraceStore
    from posttrain.trainer.trainer import Trainer

    acc = {"engine": 0.0, "train step": 0.0}
    live = [False]
    saved = {
        (cls, attr): getattr(cls, attr)
        for cls, attr in (
            (HFEngine, "generate"),
            (Trainer, "step"),
            (CpuBudget, "start"),
            (CpuBudget, "after_step"),
            (StepRollouts, "sample"),
            (TraceStore, "write_rollouts"),
        )
    }

    def timed(cls: Any, attr: str, key: str) -> None:
        inner = saved[(cls, attr)]

        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.thread_time()
            try:
                return inner(*a, **k)
            finally:
                if live[0]:
                    acc[key] += time.thread_time() - t0

        setattr(cls, attr, wrapper)

    def started(self: Any) -> Any:
        live[0] = True
        return saved[(CpuBudget, "start")](self)

    def checked(self: Any, step: int) -> Any:
        live[0] = step < steps  # the final evaluation generates too: not a step's
        return saved[(CpuBudget, "after_step")](self, step)

    timed(HFEngine, "generate", "engine")
    timed(Trainer, "step", "train step")  # the trainer runs in the loop's thread: its thread CPU is its own
    CpuBudget.start, CpuBudget.after_step = started, checked  # type: ignore[method-assign]
    if name == "before":
        StepRollouts.sample = legacy_step  # type: ignore[method-assign]
        TraceStore.write_rollouts = legacy_write  # type: ignore[assignment]
    overrides = [*quiet_run(steps, out), f"run.name={name}", f"pipeline.direct={name == 'after'}"]
    try:
        result = train(
            load_config(os.path.join(os.path.dirname(__file__), "..", "configs", "default.yaml"), overrides),
            log=lambda *_: None,
        )
    finally:
        for (cls, attr), fn in saved.items():
            setattr(cls, attr, fn)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    cpu = [r["train_cpu_s"] for r in rows if r.get("kind") == "train"]
    return {
        "name": name,
        "run": result.run_dir,
        "per step": {
            "training CPU": 1e3 * cpu[-1] / steps,
            "engine": 1e3 * acc["engine"] / steps,
            "train step": 1e3 * acc["train step"] / steps,
        },
    }


def loop_main(steps: int) -> None:
    import sqlite3

    from safetensors.torch import load_file

    from posttrain.trainer.checkpoint import latest_checkpoint

    with tempfile.TemporaryDirectory() as out:
        runs = [loop_variant(name, steps, out) for name in VARIANTS]
        traces = []
        for r in runs:
            with sqlite3.connect(r["run"] / "trace.db") as db:
                traces.append(
                    sorted(
                        db.execute("SELECT group_id, task_id, completion, reward, train_step, advantage FROM rollouts")
                    )
                )
        weights = [load_file(str(latest_checkpoint(r["run"]) / "model.safetensors")) for r in runs]
    same = all(t == traces[0] for t in traces) and all(all((w[k] == weights[0][k]).all() for k in w) for w in weights)
    print(
        f"\nthe demo's training loop, {steps} steps each, CPU ms per training step (mean); identical trace rows "
        f"and final weights: {same}"
    )
    print(f"| part | {' | '.join(VARIANTS)} | after/before |")
    print("|---|---:|---:|---:|---:|")
    per = {r["name"]: dict(r["per step"]) for r in runs}
    for p in per.values():
        p["outside engine and train step"] = p["training CPU"] - p["engine"] - p["train step"]
    for part in ("training CPU", "engine", "train step", "outside engine and train step"):
        b, a = per["before"][part], per["after"][part]
        print(f"| {part} | {' | '.join(f'{per[n][part]:.1f}' for n in VARIANTS)} | {a / b:.2f} |")
    print(
        f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (every run so far in this "
        f"process)"
    )
    if not same:
        raise SystemExit("the variants' runs differ")


# ---- --phases: the demo loop's parts outside the engine, this tree against a git revision ----

PARTS = (
    ("task pool draw", "posttrain.tasks.pool:TaskPool.draw"),
    ("task pool observe", "posttrain.tasks.pool:TaskPool.observe"),
    ("prompt encoding", "posttrain.pipeline.workers:EmbeddedWorkers.encode_now"),
    ("prompt encoding", "posttrain.pipeline.workers:EmbeddedWorkers.encode_many"),
    ("engine", "posttrain.engine.hf:HFEngine.generate"),
    ("pipeline (rest)", "posttrain.pipeline.step:StepRollouts.sample"),
    ("records", "posttrain.loop:_write_trace"),
    ("trace write", "posttrain.trace:TraceStore.write_rollouts"),
    ("mark consumed", "posttrain.trace:TraceStore.mark_consumed"),
    ("train step", "posttrain.trainer.trainer:Trainer.step"),
    ("monitor signals", "posttrain.monitor.monitor:step_signals"),
    ("monitor KL", "posttrain.monitor.kl:kl_to_reference"),
    ("monitor (rest)", "posttrain.monitor.monitor:Monitor.after_step"),
    ("metrics log", "posttrain.metrics_log:MetricsLog.write"),
    ("loop (rest)", "posttrain.loop:_step"),
)
"""(part, where): each wrapped callable's CPU is counted in its part less what the wrapped
callables it calls spend (exclusive time). A callable missing from a tree is skipped there;
the first entry of a part that a tree has is its wrapper (EmbeddedWorkers.encode_many calls
encode_now only as a fallback)."""


def _wrap_parts(acc: dict[str, float], live: list[bool]) -> None:
    """Wrap every callable of PARTS that this tree has: exclusive CPU per part (the process's: a
    library's helper threads, such as the Rust tokenizer's, count in the part that ran them)."""
    import importlib

    stack: list[float] = []  # per open call: CPU its wrapped callees spent

    def wrap(part: str, inner: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.process_time()
            stack.append(0.0)
            try:
                return inner(*a, **k)
            finally:
                spent = time.process_time() - t0
                children = stack.pop()
                if stack:
                    stack[-1] += spent
                if live[0]:
                    acc[part] = acc.get(part, 0.0) + spent - children

        return wrapper

    for part, where in PARTS:
        module_name, _, attr = where.partition(":")
        module = importlib.import_module(module_name)
        owner_name, _, method = attr.rpartition(".")
        owner = getattr(module, owner_name) if owner_name else module
        name = method or attr
        if not hasattr(owner, name):
            continue
        setattr(owner, name, wrap(part, getattr(owner, name)))


def phases_child(src: str, steps: int, model: str | None, out: str) -> None:
    """One demo training run of the tree at `src` (its posttrain first on sys.path): CPU per part
    per step, written as JSON to `out`/result.json; the run dir stays under `out`."""
    import sys

    sys.path.insert(0, src)
    import posttrain

    assert os.path.realpath(posttrain.__file__).startswith(os.path.realpath(src)), posttrain.__file__
    from posttrain.configs import load_config
    from posttrain.loop import train
    from posttrain.monitor.budget import CpuBudget

    acc: dict[str, float] = {}
    live = [False]
    start, after_step = CpuBudget.start, CpuBudget.after_step

    def started(self: Any) -> Any:
        live[0] = True
        return start(self)

    def checked(self: Any, step: int) -> Any:
        live[0] = step < steps  # the final evaluation is not a step's
        return after_step(self, step)

    CpuBudget.start, CpuBudget.after_step = started, checked  # type: ignore[method-assign]
    _wrap_parts(acc, live)
    overrides = [*quiet_run(steps, out), "run.name=run"] + ([f"model.path={model}"] if model else [])
    result = train(load_config(os.path.join(src, "..", "configs", "default.yaml"), overrides), log=lambda *_: None)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    cpu = [r["train_cpu_s"] for r in rows if r.get("kind") == "train"]
    per = {part: 1e3 * s / steps for part, s in acc.items()}
    per["training CPU"] = 1e3 * cpu[-1] / steps
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"per_step": per, "run": str(result.run_dir), "rss_mib": rss}, f)


def phases_main(steps: int, model: str | None, rev: str, rounds: int) -> None:
    """`rounds` demo runs of `rev`'s tree and of this tree, alternately, each in its own process:
    CPU ms per step of each part (median over rounds), trace rows and final weights checked identical."""
    import sqlite3
    import subprocess
    import sys

    from safetensors.torch import load_file

    from posttrain.trainer.checkpoint import latest_checkpoint

    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "base")
        os.makedirs(base)
        archive = subprocess.run(["git", "-C", root, "archive", rev, "src", "configs"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", base], input=archive.stdout, check=True)
        trees = {rev: os.path.join(base, "src"), "this": os.path.join(root, "src")}
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for k in range(rounds):
            for name, src in trees.items():
                out = os.path.join(tmp, f"{name.replace('/', '_')}-{k}")
                os.makedirs(out)
                cmd = [sys.executable, __file__, "--phases-child", src, "--phases", str(steps), "--out", out]
                subprocess.run(cmd + (["--model", model] if model else []), check=True)
                with open(os.path.join(out, "result.json")) as f:
                    results[name].append(json.load(f))
        traces, weights = [], []
        for name in trees:
            run = results[name][0]["run"]
            with sqlite3.connect(os.path.join(run, "trace.db")) as db:
                traces.append(
                    sorted(
                        db.execute(
                            "SELECT group_id, task_id, prompt, completion, reward, passed, train_step, advantage, "
                            "ratio, clipped, sampling, parts, timings IS NOT NULL FROM rollouts"
                        )
                    )
                )
            weights.append(load_file(str(latest_checkpoint(run) / "model.safetensors")))
    same = traces[0] == traces[1] and all((weights[0][k] == weights[1][k]).all() for k in weights[0])
    parts = list(dict.fromkeys(p for p, _ in PARTS))
    med = {
        name: {p: statistics.median(r["per_step"].get(p, 0.0) for r in runs) for p in [*parts, "training CPU"]}
        for name, runs in results.items()
    }
    outside = [p for p in parts if p not in ("engine", "train step")]
    print(
        f"the demo's training loop, {steps} steps, {rounds} run(s) each, alternately; CPU ms per step (median of "
        f"runs, exclusive of the parts it calls); identical trace rows ({len(traces[0])}) and final weights: {same}"
    )
    print(f"| part | {rev} | this | this/{rev} |")
    print("|---|---:|---:|---:|")

    def line(label: str, b: float, a: float) -> None:
        print(f"| {label} | {b:.2f} | {a:.2f} | {a / b if b else float('nan'):.2f} |")

    for p in parts:
        line(p, med[rev][p], med["this"][p])
    line("**outside engine and train step**", *(sum(med[n][p] for p in outside) for n in trees))
    line("training CPU (the loop's count)", med[rev]["training CPU"], med["this"]["training CPU"])
    rss = {name: max(r["rss_mib"] for r in runs) for name, runs in results.items()}
    print(f"peak RSS (MiB, the largest run): {rev} {rss[rev]:.0f}, this {rss['this']:.0f}")
    if not same:
        raise SystemExit("the two trees' runs differ")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--model", default=None, help="a model directory (default: the tiny preset, random weights)")
    ap.add_argument("--loop", type=int, default=0, metavar="N", help="also compare N-step training runs")
    ap.add_argument("--phases", type=int, default=0, metavar="N", help="only: N-step demo runs, part by part, vs --rev")
    ap.add_argument("--rev", default="main", help="the git revision --phases compares this tree with")
    ap.add_argument("--rounds", type=int, default=2, help="--phases: runs of each tree, alternately")
    ap.add_argument("--phases-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.phases_child:
        return phases_child(args.phases_child, args.phases, args.model, args.out)
    if args.phases:
        return phases_main(args.phases, args.model, args.rev, args.rounds)
    import torch

    from posttrain.configs import load_config

    torch.set_num_threads(1)
    cfg = load_config(os.path.join(os.path.dirname(__file__), "..", "configs", "default.yaml"), [])
    with tempfile.TemporaryDirectory() as out:
        variants = [variant(name, cfg, args.model, out) for name in VARIANTS]
        for number in range(args.steps + 1):  # step 0 warms up
            for v in variants:
                step(v, number)
        for v in variants:
            v["rollouts"].close()
            v["trace"].close()
    same = all(v["seen"] == variants[0]["seen"] for v in variants)
    med = {v["name"]: {p: statistics.median(v["times"][p][1:]) * 1e3 for p in PHASES} for v in variants}
    print(
        f"demo rollout step (32 prompts x {cfg.rollout.group_size}), median CPU ms per step over {args.steps} "
        f"steps; identical rollouts: {same}"
    )
    print(f"| phase | {' | '.join(VARIANTS)} | after/before |")
    print("|---|---:|---:|---:|---:|")

    def line(label: str, values: dict[str, float]) -> None:
        b, a = values["before"], values["after"]
        print(f"| {label} | {' | '.join(f'{values[n]:.1f}' for n in VARIANTS)} | {a / b if b else float('nan'):.2f} |")

    for p in PHASES:
        line(p, {n: m[p] for n, m in med.items()})
    line("outside the engine", {n: sum(m[p] for p in PHASES if p != "engine") for n, m in med.items()})
    line("whole rollout step", {n: sum(m.values()) for n, m in med.items()})
    print(
        f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (the three variants, "
        f"one process)"
    )
    if not same:
        raise SystemExit("the variants' rollouts differ")
    if args.loop:
        loop_main(args.loop)


if __name__ == "__main__":
    main()
