"""Trainer step cost of the scale options on the CPU, each variant in its own process.

Same model (embedded `small` preset, 4.8M parameters, random), same batch
(32 rows, prompts of 16 tokens, completions of 96, off-policy log-probs),
same seed. Per variant: median seconds per step over --steps steps (after one
warm-up) and the process's peak RSS growth during the steps (the memory the
steps needed beyond the loaded model). Ratios are against the default variant.

    .venv/bin/python bench/scale_step.py --steps 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

VARIANTS = {
    "default": {},
    "gradient_checkpointing": {"gradient_checkpointing": True},
    "bf16_autocast": {"precision": "bf16_autocast"},
    "micro_batch_tokens=512": {"micro_batch_tokens": 512},
    "lora r=8": {"lora": {"rank": 8, "alpha": 16}},
}


def one(options: dict, steps: int) -> dict:
    import random

    import torch

    from posttrain.configs.trainer import TrainerConfig
    from posttrain.model.arch import random_model
    from posttrain.trainer.batch import TrainBatch, TrainRow
    from posttrain.trainer.trainer import Trainer

    torch.set_num_threads(1)
    model, _ = random_model("small", 0)
    vocab = model.get_input_embeddings().num_embeddings
    rng = random.Random(0)
    rows = tuple(
        TrainRow(
            tuple(rng.randrange(vocab) for _ in range(16)),
            tuple(rng.randrange(vocab) for _ in range(96)),
            tuple(-4.0 for _ in range(96)),
            float(k % 2),
            f"g{k // 4}",
            (1,) * 96,
        )
        for k in range(32)
    )
    trainer = Trainer(model, TrainerConfig(lr=1e-4, micro_batch_size=32, **options))
    trainer.step(TrainBatch(rows))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        trainer.step(TrainBatch(rows))
        times.append(time.perf_counter() - t0)
    return {
        "s_per_step": statistics.median(times),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_growth_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one(VARIANTS[args.child], args.steps)))
        return 0
    results = {}
    for name in VARIANTS:
        out = subprocess.run(
            [sys.executable, __file__, "--child", name, "--steps", str(args.steps)],
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            check=True,
        )
        results[name] = json.loads(out.stdout.strip().splitlines()[-1])
    base = results["default"]
    print(f"{'variant':24s} {'s/step':>8s} {'x default':>9s} {'peak RSS MiB':>12s}")
    for name, r in results.items():
        print(
            f"{name:24s} {r['s_per_step']:8.3f} {r['s_per_step'] / base['s_per_step']:9.2f} {r['peak_rss_mib']:12.0f}"
        )
    print(
        f"(peak RSS is per variant process: model, optimizer and the step's activations; "
        f"this driver: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
