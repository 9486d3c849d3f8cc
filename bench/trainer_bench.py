"""Trainer step cost, side by side in one run: micro-batch sizes against the
automatic one (the default), rows sorted by length against batch order, the LM
head on loss tokens only (the default) against the model's forward with
`logits_to_keep` and against full logits, and the guard's rollback copy against
skip. Prints ratios and peak RSS.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/trainer_bench.py
    OMP_NUM_THREADS=1 ... bench/trainer_bench.py --prompts 13 --prompt-len 20 --max-tokens 6   # the demo's shape
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import random
import resource
import statistics
import time

import torch

from posttrain.configs.trainer import GuardConfig, TrainerConfig
from posttrain.model.arch import random_model
from posttrain.trainer.batch import TrainBatch, TrainRow
from posttrain.trainer.trainer import Trainer


class ModelForward(torch.nn.Module):
    """The same model seen only through its forward: no get_decoder, so the trainer
    cannot split off the LM head and calls the forward (with `logits_to_keep` when
    `keep` is true, else full logits at every position)."""

    def __init__(self, inner: torch.nn.Module, keep: bool) -> None:
        super().__init__()
        self.inner = inner
        self.keep = keep

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, input_ids, attention_mask, logits_to_keep=0):
        return self.inner(
            input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep if self.keep else 0
        )


def batch(seed: int, vocab: int, prompts: int, group: int, prompt_len: int, max_tokens: int) -> TrainBatch:
    rng = random.Random(seed)
    rows = []
    for g in range(prompts):
        prompt = tuple(rng.randrange(8, vocab) for _ in range(rng.randint(prompt_len // 2, prompt_len)))
        for k in range(group):
            comp = tuple(rng.randrange(8, vocab) for _ in range(rng.randint(4, max_tokens)))
            rows.append(TrainRow(prompt, comp, tuple(-4.5 for _ in comp), float(k % 2), g, (1,) * len(comp), 1.0))
    return TrainBatch(tuple(rows))


def interleaved(trainers: dict[str, Trainer], batches: list[TrainBatch]) -> dict[str, float]:
    """Median CPU seconds per step for each trainer (process CPU time: with one
    thread it does not count time spent waiting for a core on a shared machine);
    the trainers take turns at every step, so drifting load hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in trainers}
    for trainer in trainers.values():
        trainer.step(batches[0])  # warm-up
    for b in batches[1:]:
        for name, trainer in trainers.items():
            t0 = time.process_time()
            trainer.step(b)
            times[name].append(time.process_time() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model, tok = random_model(args.preset, seed=0)
    n_params = sum(p.numel() for p in model.parameters())
    shape = (len(tok), args.prompts, args.group, args.prompt_len, args.max_tokens)
    batches = [batch(s, *shape) for s in range(args.steps + 1)]
    print(
        f"preset {args.preset} ({n_params / 1e6:.2f}M params), {args.prompts}x{args.group} rows, "
        f"prompts <= {args.prompt_len}, completions <= {args.max_tokens}, threads {torch.get_num_threads()}"
    )
    configs = {
        "mb8 (old default)": (None, TrainerConfig(micro_batch_size=8)),
        "mb16 unsorted": (None, TrainerConfig(micro_batch_size=16, sort_by_length=False)),
        "mb64": (None, TrainerConfig(micro_batch_size=64)),
        "mb256": (None, TrainerConfig(micro_batch_size=256)),
        "auto (default)": (None, TrainerConfig()),
        "auto, forward+logits_to_keep": (True, TrainerConfig()),
        "auto, full logits": (False, TrainerConfig()),
        "auto, rollback guard": (None, TrainerConfig(guard=GuardConfig(action="rollback"))),
    }
    trainers = {}
    for name, (keep, cfg) in configs.items():
        fresh, _ = random_model(args.preset, seed=0)
        trainers[name] = Trainer(fresh if keep is None else ModelForward(fresh, keep), cfg)
    results = interleaved(trainers, batches)
    tokens = sum(len(r.completion_ids) for r in batches[1].rows)
    for name, seconds in results.items():
        print(f"  {name:30s} {seconds * 1e3:8.1f} ms CPU/step  {tokens / seconds:9.0f} completion tokens per CPU-s")
    base = results["mb8 (old default)"]
    print("ratios (time / mb8, the old default): " + ", ".join(f"{k} {v / base:.2f}" for k, v in results.items()))
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
