"""Trainer memory on the real model (SmolLM2-135M-Instruct, LoRA as configs/real.yaml trains it):
the peak RSS a train step adds per padded token, against the trainer's estimate
(trainer/memory.py bytes_per_token), by row shape; and the process's RSS between steps with and
without handing the freed heap back (trainer/memory.py release_freed_memory, the default now).

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/real_memory.py [--model DIR] [--budget 1866]

Each measurement runs in a fresh process (a step's freed memory stays in the process that freed
it, so a second step in the same process would read low). Rows are random token ids with rewards
0/1 alternating in groups of 4 sharing a prompt, as the loop's groups do.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

SHAPES = [(8, 100, 128), (4, 300, 300), (2, 1200, 800), (16, 100, 128)]


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _rows(rng, n: int, plen: int, clen: int, shared: bool):
    from posttrain.trainer.batch import TrainRow

    rows, prompt = [], ()
    for i in range(n):
        if not shared or i % 4 == 0:
            prompt = tuple(rng.randrange(1000, 20000) for _ in range(plen))
        c = tuple(rng.randrange(1000, 20000) for _ in range(clen))
        rows.append(TrainRow(prompt, c, tuple([-3.0] * clen), float(i % 2), i // 4, tuple([1] * clen)))
    return tuple(rows)


def worker(args: argparse.Namespace) -> dict:
    import random

    import posttrain.trainer.trainer as trainer_module
    from posttrain.configs.trainer import TrainerConfig
    from posttrain.model.arch import load_model
    from posttrain.trainer.batch import TrainBatch
    from posttrain.trainer.memory import bytes_per_token

    if args.keep_freed:
        trainer_module.release_freed_memory = lambda device: False  # the behaviour before
    model, _ = load_model(args.model)
    cfg = TrainerConfig(lr=2e-4, lora={"rank": 16, "alpha": 32}, micro_batch_tokens=args.budget)
    trainer = trainer_module.Trainer(model, cfg)
    rng = random.Random(0)
    out: dict = {"estimate_mib": bytes_per_token(trainer.model, False, True) / 2**20, "steps": []}
    for _ in range(args.steps):
        n, plen, clen = SHAPES[args.shape]
        batch = TrainBatch(_rows(rng, n, plen, clen, shared=True))
        base = _status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        started = time.process_time()
        trainer.step(batch)
        out["steps"].append(
            {
                "tokens": n * (plen + clen),
                "rise_mib": (_status("VmHWM") - base) / 2**20,
                "after_mib": _status("VmRSS") / 2**20,
                "cpu_s": time.process_time() - started,
            }
        )
    return out


def run(model: str, shape: int, steps: int, budget: int, keep_freed: bool) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--model", model, "--shape", str(shape), "--steps", str(steps)]
    cmd += ["--budget", str(budget)] + (["--keep-freed"] if keep_freed else [])
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=str(Path.home() / ".cache/posttrain/models/smollm2-135m-instruct"))
    p.add_argument("--budget", type=int, default=1866, help="part 2: padded tokens a micro-batch")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shape", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--keep-freed", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started = time.time()
    print("1. peak RSS a step adds per token, the whole batch in one pass, one fresh process each")
    print(" rows x prompt+completion | tokens | rise MiB | MiB/token | estimate MiB/token | CPU s")
    for i, (n, plen, clen) in enumerate(SHAPES):
        r = run(args.model, i, 1, 10**6, False)
        s = r["steps"][0]
        per = s["rise_mib"] / s["tokens"]
        print(
            f" {n:>4} x {plen:>4}+{clen:<4}          | {s['tokens']:>6} | {s['rise_mib']:>8.0f} | {per:>9.2f} "
            f"| {r['estimate_mib']:>18.2f} | {s['cpu_s']:.0f}"
        )
    print(f"\n2. RSS after each of 3 steps (16 rows x 100+128, budget {args.budget}), freed heap kept vs handed back")
    for keep in (True, False):
        r = run(args.model, 3, 3, args.budget, keep)
        after = ", ".join(f"{s['after_mib']:.0f}" for s in r["steps"])
        peak = max(s["rise_mib"] for s in r["steps"])
        label = "kept (before)" if keep else "handed back (now)"
        print(f" {label:<18} RSS after each step MiB: {after}; largest rise {peak:.0f}")
    print(f"\nwall {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
