"""What evaluation costs a demo run: the old before/after greedy eval against everything the
run now evaluates (checks at start, full set with pass@k/maj@k before and after, the fixed
subset and a rotation slice every `eval.every_steps`), on the demo's base and domains.

Prints both side by side, measured in one run, and the peak RSS.
Run: OMP_NUM_THREADS=1 .venv/bin/python bench/evaluation.py [configs/default.yaml]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import resource
import sys
import tempfile
import time
from pathlib import Path

from posttrain.configs import load_config
from posttrain.engine.hf import HFEngine
from posttrain.evaluate import evaluate
from posttrain.evaluate.run import RunEvaluator
from posttrain.metrics_log import MetricsLog
from posttrain.model.arch import load_model
from posttrain.model.pretrain import ensure_base
from posttrain.tasks.pool import TaskPool


def main() -> None:
    import torch

    cfg = load_config(sys.argv[1] if len(sys.argv) > 1 else "configs/default.yaml", ["run.threads=1"])
    torch.set_num_threads(1)
    base = ensure_base(cfg.base, progress=False)
    model, tok = load_model(base)
    engine = HFEngine(model, tok, seed=0)
    pool = TaskPool(cfg.tasks, seed=cfg.run.seed)
    levels = {n: pool.eval_difficulty(n) for n in pool.names}
    periodic = (cfg.run.steps - 1) // cfg.eval.every_steps if cfg.eval.every_steps else 0

    t0 = time.perf_counter()
    for _ in range(2):  # before and after, greedy, as the loop did before (every_steps was 0)
        evaluate(engine, levels, cfg.eval.tasks_per_domain, cfg.eval.max_tokens)
    old = time.perf_counter() - t0

    with tempfile.TemporaryDirectory() as tmp:
        metrics = MetricsLog(Path(tmp) / "metrics.jsonl")
        ev = RunEvaluator(cfg, Path(tmp), engine, metrics, levels, log=lambda *_: None)
        t0 = time.perf_counter()
        ev.checks(model, tok, lambda: TaskPool(cfg.tasks, seed=cfg.run.seed))
        checks = time.perf_counter() - t0
        t0 = time.perf_counter()
        ev.full(0)
        ev.full(cfg.run.steps)
        full = time.perf_counter() - t0
        t0 = time.perf_counter()
        for i in range(1, periodic + 1):
            ev.periodic(i * cfg.eval.every_steps)
        during = time.perf_counter() - t0
        metrics.close()
    new = checks + full + during
    print(
        f"domains {list(levels)}, {cfg.run.steps} steps, eval every {cfg.eval.every_steps} ({periodic} evaluations "
        f"of {cfg.eval.subset_tasks} + {cfg.eval.rotation_tasks} rotation items per domain), samples {cfg.eval.samples}"
    )
    print(f"{'':<44}{'seconds':>9}")
    print(f"{'old: greedy full set before + after':<44}{old:>9.2f}")
    print(f"{'new: contamination + exposure checks':<44}{checks:>9.2f}")
    print(f"{'new: full set + pass@k/maj@k before + after':<44}{full:>9.2f}")
    print(f"{'new: periodic subset + rotation slices':<44}{during:>9.2f}")
    print(f"{'new: total':<44}{new:>9.2f}   ratio new/old {new / old:.1f}x, added {new - old:.1f} s")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
