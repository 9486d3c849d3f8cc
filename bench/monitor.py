"""Monitor overhead per training step, on synthetic groups shaped like the demo's (32 prompts x 8 samples).

Prints the cost of each part of `Monitor.after_step` side by side, measured
in one run, and the peak RSS. Run: OMP_NUM_THREADS=1 .venv/bin/python bench/monitor.py
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import random
import resource
import statistics
import tempfile
import time
from pathlib import Path

from posttrain.configs import load_config
from posttrain.domains.registry import get
from posttrain.metrics_log import MetricsLog
from posttrain.monitor.monitor import Monitor, RunContext
from posttrain.monitor.signals import Link, step_signals
from posttrain.rollout import Rollout
from posttrain.tasks.pool import TaskPool
from posttrain.trace import TraceStore
from posttrain.types import Completion, Episode

PROMPTS, G, REPEAT = 32, 8, 30


def synthetic_groups(rng: random.Random) -> list[list[Rollout]]:
    names = ["add", "sub", "mul", "reverse", "sort"]
    groups = []
    for i in range(PROMPTS):
        dom = get(names[i % len(names)])
        task = dom.sample(i, "train", 1)
        group = []
        for _ in range(G):
            text = dom.gold(task) if rng.random() < 0.3 else "".join(rng.choices("0123456789abc", k=rng.randint(1, 8)))
            ids = tuple(ord(c) % 60 for c in text) + (1,)
            comp = Completion((5, 6, 7), ids, text, tuple(-rng.random() for _ in ids), "stop")
            group.append(Rollout(task, comp, f"1:{i}", dom.score(task, Episode(text))))
        groups.append(group)
    return groups


def interleaved(fns: dict, repeat: int = REPEAT) -> dict[str, float]:
    """Median ms of each function, the variants alternating call by call (so load hits them alike)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1000 for k, v in times.items()}


def main() -> None:
    rng = random.Random(0)
    groups = synthetic_groups(rng)
    ids = {id(r): f"r{i}" for i, r in enumerate(r for g in groups for r in g)}
    links = {rid: Link(0.5, 1.0, 0.0) for rid in ids.values()}
    cfg = load_config("configs/default.yaml", ["monitor.kl.every_steps=0", "monitor.probes.every_steps=0"])
    with tempfile.TemporaryDirectory() as tmp:
        pool = TaskPool(cfg.tasks, seed=0)
        trace, metrics = TraceStore(Path(tmp) / "trace.db"), MetricsLog(Path(tmp) / "metrics.jsonl")
        run = RunContext.of(cfg, Path(tmp))
        mon = Monitor(cfg.monitor, run, trace, metrics, pool, log=lambda *_: None)
        no_audit_cfg = cfg.monitor.model_copy(update={"audit": cfg.monitor.audit.model_copy(update={"enabled": False})})
        no_audit = Monitor(no_audit_cfg, run, trace, metrics, pool, log=lambda *_: None)
        step = iter(range(1, 10**6))
        ms = interleaved(
            {
                "signals": lambda: step_signals(groups, groups, {}, 2, 64),
                "full": lambda: mon.after_step(next(step), groups, groups, ids, links),
                "no_audit": lambda: no_audit.after_step(next(step), groups, groups, ids, links),
            }
        )
        signals_ms, full_ms, no_audit_ms = ms["signals"], ms["full"], ms["no_audit"]
        kl_ms = _kl_ms(groups, cfg.monitor.kl.rows)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"groups: {PROMPTS} x {G}, median of {REPEAT}")
    print(f"step_signals only              {signals_ms:7.2f} ms")
    print(f"after_step without audit       {no_audit_ms:7.2f} ms")
    print(f"after_step with audit          {full_ms:7.2f} ms   (audit adds {full_ms - no_audit_ms:+.2f} ms)")
    print("(the demo's step takes about 300 ms: generation plus training)")
    if kl_ms is not None:
        every = load_config("configs/default.yaml").monitor.kl.every_steps
        print(
            f"KL measurement (tiny model)    {kl_ms['kl']:7.2f} ms   (every {every} steps: {kl_ms['kl'] / every:.2f} "
            "ms/step)"
        )
        print(
            f"trainer step on the same batch {kl_ms['train_step']:7.2f} ms   (KL / train step = "
            f"{kl_ms['kl'] / kl_ms['train_step']:.2f})"
        )
    print(f"peak RSS {rss:.0f} MiB")


def _kl_ms(groups, rows: int) -> dict[str, float] | None:
    from posttrain.model.pretrain import default_dir

    path = default_dir(load_config("configs/default.yaml").base)
    if not (path / "config.json").is_file():
        return None
    import torch

    torch.set_num_threads(1)
    from posttrain.model.arch import load_model
    from posttrain.monitor.kl import kl_to_reference

    ref = load_model(path)[0]
    from posttrain.configs.trainer import TrainerConfig
    from posttrain.trainer.batch import TrainBatch, TrainRow
    from posttrain.trainer.trainer import Trainer

    policy = load_model(path)[0]
    trainer = Trainer(policy, TrainerConfig())
    batch = TrainBatch(
        tuple(TrainRow.from_completion(r.completion, float(r.reward), r.group_id, 1.0) for g in groups for r in g)
    )
    return interleaved(
        {"kl": lambda: kl_to_reference(ref, groups, 1.0, rows), "train_step": lambda: trainer.step(batch)}, repeat=10
    )


if __name__ == "__main__":
    main()
