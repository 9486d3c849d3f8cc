"""Trainer memory on the real model (SmolLM2-135M-Instruct, LoRA as configs/real.yaml trains it):
the peak RSS a train step adds per padded token, against the trainer's estimate
(trainer/memory.py bytes_per_token), by row shape; the process's RSS between steps with and
without handing the freed heap back (trainer/memory.py release_freed_memory, the default now); and
the monitor's KL to the initial model (monitor/kl.py, every monitor.kl.every_steps=10 steps, 32
rows) from full logits as it was against the trainer's chunked log-probs (now).

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


def kl_worker(args: argparse.Namespace) -> dict:
    """The monitor's KL on 32 rollouts (8 groups of 4, prompt 150 + completion 250 tokens)."""
    import random
    from types import SimpleNamespace

    import torch

    from posttrain.model.arch import load_model
    from posttrain.monitor import kl
    from posttrain.types import Completion

    model, _ = load_model(args.model)
    rng, groups = random.Random(0), []
    for g in range(8):
        prompt = tuple(rng.randrange(1000, 20000) for _ in range(150))
        group = []
        for _ in range(4):
            ids = tuple(rng.randrange(1000, 20000) for _ in range(250))
            c = Completion(prompt, ids, "", tuple([-3.0] * 250), "length")
            group.append(SimpleNamespace(completion=c, task=SimpleNamespace(domain=f"d{g % 2}")))
        groups.append(group)
    if args.kl == "full":  # monitor/kl.py before: the reference's forward, every position's logits at once

        def full(reference, groups, temperature, rows):
            picked = kl.pick_rows(groups, rows)
            batch = [kl.TrainRow.from_completion(r.completion, 0.0, 0, temperature) for r in picked]
            packed = kl.pack_rows(batch, torch.device("cpu"))
            keep = packed.input_ids_bs.shape[1] - packed.first_index
            logits = reference(
                input_ids=packed.input_ids_bs, attention_mask=packed.attention_bs, logits_to_keep=keep
            ).logits.float()
            vocab, offset = logits.shape[-1], packed.input_ids_bs.shape[1] - logits.shape[1]
            logits_bcv = logits.gather(1, (packed.index_bc - offset)[..., None].expand(-1, -1, vocab))
            ref = (logits_bcv / packed.temperature_b[:, None, None]).log_softmax(-1)
            return ref.gather(-1, packed.target_bc[..., None]).squeeze(-1).sum().item()

        measure = torch.no_grad()(full)
    else:
        measure = kl.kl_to_reference
    base = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    started = time.process_time()
    measure(model, groups, 0.7, 32)
    return {"rise_mib": (_status("VmHWM") - base) / 2**20, "cpu_s": time.process_time() - started}


def run(model: str, shape: int, steps: int, budget: int, keep_freed: bool) -> dict:
    cmd = [sys.executable, __file__, "--worker", "--model", model, "--shape", str(shape), "--steps", str(steps)]
    cmd += ["--budget", str(budget)] + (["--keep-freed"] if keep_freed else [])
    return _worker_json(cmd)


def _worker_json(cmd: list[str]) -> dict:
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
    p.add_argument("--kl", choices=("full", "chunked"), help=argparse.SUPPRESS)
    p.add_argument("--parts", default="123", help="which parts to run (default all: 123)")
    args = p.parse_args()
    if args.worker:
        print(json.dumps(kl_worker(args) if args.kl else worker(args)))
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started = time.time()
    print("1. peak RSS a step adds per token, the whole batch in one pass, one fresh process each")
    print(" rows x prompt+completion | tokens | rise MiB | MiB/token | estimate MiB/token | CPU s")
    for i, (n, plen, clen) in enumerate(SHAPES if "1" in args.parts else ()):
        r = run(args.model, i, 1, 10**6, False)
        s = r["steps"][0]
        per = s["rise_mib"] / s["tokens"]
        print(
            f" {n:>4} x {plen:>4}+{clen:<4}          | {s['tokens']:>6} | {s['rise_mib']:>8.0f} | {per:>9.2f} "
            f"| {r['estimate_mib']:>18.2f} | {s['cpu_s']:.0f}"
        )
    print(f"\n2. RSS after each of 3 steps (16 rows x 100+128, budget {args.budget}), freed heap kept vs handed back")
    for keep in (True, False) if "2" in args.parts else ():
        r = run(args.model, 3, 3, args.budget, keep)
        after = ", ".join(f"{s['after_mib']:.0f}" for s in r["steps"])
        peak = max(s["rise_mib"] for s in r["steps"])
        label = "kept (before)" if keep else "handed back (now)"
        print(f" {label:<18} RSS after each step MiB: {after}; largest rise {peak:.0f}")
    print("\n3. the monitor's KL to the initial model, 32 rows of 150 + 250 tokens: peak RSS it adds")
    for how in ("full", "chunked") if "3" in args.parts else ():
        cmd = [sys.executable, __file__, "--worker", "--model", args.model, "--kl", how]
        r = _worker_json(cmd)
        label = "full logits (before)" if how == "full" else "chunked (now)"
        print(f" {label:<21} rise {r['rise_mib']:>6.0f} MiB, {r['cpu_s']:.0f} CPU s")
    print(f"\nwall {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
