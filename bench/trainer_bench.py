"""Trainer step cost, side by side in one run: micro-batch sizes against the
automatic one (the default), rows sorted by length against batch order, the LM
head on loss tokens only (the default) against the model's forward with
`logits_to_keep` and against full logits, and the guard's rollback copy against
skip. Prints ratios and peak RSS.

With `--demo N`, the demo's own train steps instead: configs/default.yaml's training loop runs
N steps on the embedded base with the trainer before the cuts and then after them (the
loop's training CPU and Trainer.step's per step), recording every train step's batch and the
weights it started from; each recorded step is then replayed from those weights by the
trainer before and with each cut, taking turns at every step (CPU ms per step, median and
mean), and each cut's loss, gradient norm and updated weights are compared with before:
- before: AdamW and the gradient clip with torch's CPU default (a Python loop over the
  parameters), every row forwarding its whole sequence (`as_was`);
- foreach: AdamW and the clip with foreach kernels (bit-identical updates);
- after (the default now): foreach, and a micro-batch whose rows share prompts forwards each
  distinct prompt once (the completions attend to its copied keys/values); equal to before up
  to float summation order.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/trainer_bench.py
    OMP_NUM_THREADS=1 ... bench/trainer_bench.py --prompts 13 --prompt-len 20 --max-tokens 6   # the demo's shape
    OMP_NUM_THREADS=1 ... bench/trainer_bench.py --demo 60   # the demo's own steps, before/after each cut
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import json
import random
import resource
import statistics
import time
from typing import Any

import torch
from common import quiet_run  # bench/common.py: this script runs with bench/ first on sys.path

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


DEMO_VARIANTS = ("before", "foreach", "after")
_CLIP = torch.nn.utils.clip_grad_norm_
_CLIP_AS_WAS = [False]


def _clip(params: Any, max_norm: float, foreach: bool | None = None) -> torch.Tensor:
    """The gradient clip, with torch's CPU default (no foreach) while _CLIP_AS_WAS[0] is set."""
    return _CLIP(params, max_norm, foreach=None if _CLIP_AS_WAS[0] else foreach)


def as_was(trainer: Trainer, foreach: bool = False) -> Trainer:
    """The trainer before the cuts: every row forwards its whole sequence, and (unless `foreach`)
    AdamW with torch's CPU default (a Python loop over the parameters)."""
    trainer._share_prompts = False
    if not foreach:
        cfg = trainer.config
        trainer.optimizer = torch.optim.AdamW(trainer.params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    return trainer


def record_demo(steps: int, out: str, name: str) -> tuple[list[tuple[dict, TrainBatch]], Any, dict[str, float]]:
    """One demo training loop (configs/default.yaml, `steps` steps) with the trainer `name`
    (before: `as_was`; after: as it is): each train step's (weights before it, batch), the
    config, and CPU ms per training step (the loop's own training CPU count; Trainer.step's)."""
    from posttrain.configs import load_config
    from posttrain.loop import train

    recorded: list[tuple[dict, TrainBatch]] = []
    step_cpu = [0.0]
    inner_step, inner_init = Trainer.step, Trainer.__init__

    def step(self: Trainer, b: TrainBatch):
        recorded.append(({k: v.detach().clone() for k, v in self.model.state_dict().items()}, b))
        _CLIP_AS_WAS[0] = name == "before"
        t0 = time.thread_time()
        try:
            return inner_step(self, b)
        finally:
            step_cpu[0] += time.thread_time() - t0
            _CLIP_AS_WAS[0] = False

    def init(self: Trainer, *a: Any, **k: Any) -> None:
        inner_init(self, *a, **k)
        if name == "before":
            as_was(self)

    overrides = [*quiet_run(steps, out), f"run.name={name}"]
    cfg = load_config(os.path.join(os.path.dirname(__file__), "..", "configs", "default.yaml"), overrides)
    Trainer.step, Trainer.__init__ = step, init  # type: ignore[method-assign]
    try:
        result = train(cfg, log=lambda *_: None)
    finally:
        Trainer.step, Trainer.__init__ = inner_step, inner_init  # type: ignore[method-assign]
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    cpu = [r["train_cpu_s"] for r in rows if r.get("kind") == "train"]
    return recorded, cfg, {"training CPU": 1e3 * cpu[-1] / steps, "Trainer.step": 1e3 * step_cpu[0] / steps}


def demo_main(steps: int) -> None:
    """The demo's loop with the trainer before and after the cuts, then its recorded train
    steps replayed by each variant of the trainer, side by side."""
    import tempfile

    from posttrain.model.arch import load_model
    from posttrain.model.pretrain import ensure_base

    torch.nn.utils.clip_grad_norm_ = _clip
    with tempfile.TemporaryDirectory() as out:
        loops = {}
        for name in ("before", "after"):
            recorded, cfg, loops[name] = record_demo(steps, out, name)
    print(f"the demo's training loop (configs/default.yaml, {steps} steps each, one after another in this")
    print("process), CPU ms per training step (mean):")
    print("| part | before | after | after/before |\n|---|---:|---:|---:|")
    for part in ("training CPU", "Trainer.step"):
        b, a = loops["before"][part], loops["after"][part]
        print(f"| {part} | {b:.1f} | {a:.1f} | {a / b:.2f} |")
    model_dir = cfg.model.path or ensure_base(cfg.base, progress=False)
    trainers = {name: Trainer(load_model(model_dir)[0], cfg.trainer) for name in DEMO_VARIANTS}
    as_was(trainers["before"])
    as_was(trainers["foreach"], foreach=True)
    times: dict[str, list[float]] = {n: [] for n in DEMO_VARIANTS}
    diffs: dict[str, list[tuple[float, float, float]]] = {n: [] for n in DEMO_VARIANTS}
    for i, (state, b) in enumerate(recorded):
        got = {}
        for name, t in trainers.items():
            t.model.load_state_dict(state)
            _CLIP_AS_WAS[0] = name == "before"
            t0 = time.thread_time()
            stats = t.step(b)
            if i:  # the first step warms up
                times[name].append(time.thread_time() - t0)
            _CLIP_AS_WAS[0] = False
            got[name] = (stats, [p.detach().clone() for p in t.params])
        s0, w0 = got["before"]
        for name, (s, w) in got.items():
            weight_diff = max(float((a - c).abs().max()) for a, c in zip(w0, w))
            diffs[name].append((abs(s.loss - s0.loss), abs(s.grad_norm - s0.grad_norm) / s0.grad_norm, weight_diff))
    rows = sum(len(b.rows) for _, b in recorded) / len(recorded)
    print(
        f"\nthe after loop's {len(recorded)} train steps ({rows:.0f} rows a step on average) replayed from the weights"
    )
    print("each started from, the variants taking turns (the first step warms up), CPU ms per Trainer.step;")
    print("differences from `before` (loss, gradient norm, updated weights), max over the steps:")
    print("| variant | median | mean | median / before | loss | grad norm (rel) | weights |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    med0 = statistics.median(times["before"])
    for name in DEMO_VARIANTS:
        med, mean = statistics.median(times[name]), statistics.mean(times[name])
        d = [max(x[k] for x in diffs[name]) for k in range(3)]
        print(
            f"| {name} | {med * 1e3:.1f} | {mean * 1e3:.1f} | {med / med0:.2f} | {d[0]:.1e} | {d[1]:.1e} | {d[2]:.1e} |"
        )
    print(
        f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (both loops and every variant)"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--demo", type=int, default=0, metavar="N", help="replay N train steps of the demo's loop")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.demo:
        demo_main(args.demo)
        return
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
