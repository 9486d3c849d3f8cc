"""The TRL side of bench/peer.py: TRL's GRPOTrainer on posttrain's base, tasks and verifiers.

Runs inside the peer virtual environment (`make bench-peer`: TRL 1.16.0, the project's
torch and transformers pins, posttrain installed). bench/peer.py starts it; it is not
meant to be run by hand, but can be:

    .venv-peer/bin/python bench/peer_trl.py --config configs/default.yaml --seed 0 \
        --budget-cpu-s 105 --model ~/.cache/posttrain/base-tiny-... --out /tmp/trl-0

Invariant: everything TRL sees comes from posttrain's own objects, built from one
posttrain Config: the train-split prompts in the order posttrain's TaskPool draws them
(32 per step, no shuffling), the tokenizer's chat template, each domain's verifier as the
reward (an infra error is None, which TRL turns into NaN and leaves out, never 0), and
the trainer settings (G, prompts per step, lr, betas, weight decay, grad clip, loss type
and clip range, temperature, top_p, token budget, and trainer.lora: peft's LoraConfig with the
same rank, alpha, dropout and target modules, so checkpoints and the final model are adapters,
which bench/peer.py merges into the base to evaluate). Training stops after the first step
at which the process's CPU time since the start of training reaches the budget.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch, as posttrain does


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="posttrain YAML config (the task mix)")
    p.add_argument("overrides", nargs="*", help="posttrain dotted overrides, applied after the config")
    p.add_argument("--model", required=True, help="the base model directory (posttrain's embedded base)")
    p.add_argument("--out", required=True, help="output folder (checkpoints, final model, trl.json)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--budget-cpu-s", type=float, required=True, help="process CPU seconds of training")
    p.add_argument("--save-every", type=int, default=25, help="checkpoint every N steps (0: none)")
    p.add_argument(
        "--min-step-s",
        type=float,
        default=0.15,
        help="lower bound on a step's CPU time, to size the prompt list (max_steps = budget / this)",
    )
    p.add_argument(
        "--micro-batch",
        type=int,
        default=None,
        help="rows per forward/backward, gradients accumulated over the step's G x prompts rows "
        "(default: all of them in one pass)",
    )
    args = p.parse_args(argv)
    if args.micro_batch is not None and args.micro_batch < 1:
        p.error("--micro-batch must be >= 1")
    return args


class StepClock:
    """Per-step wall time split into generate, verify and train, plus the CPU budget."""

    def __init__(self, budget_cpu_s: float) -> None:
        self.budget_cpu_s = budget_cpu_s
        self.cpu0 = self.wall0 = self.last_end = self.last_cpu = 0.0
        self.acc = {"generate": 0.0, "verify": 0.0, "gen_score": 0.0, "training_step": 0.0}
        self.training_step_end = 0.0
        self.steps: list[dict[str, float]] = []
        self.stop_reason = ""

    def start(self) -> None:
        self.cpu0, self.wall0 = time.process_time(), time.perf_counter()
        self.last_end = self.wall0

    def add(self, key: str, seconds: float) -> None:
        self.acc[key] += seconds

    def cpu_used(self) -> float:
        return time.process_time() - self.cpu0

    def end_step(self, step: int) -> bool:
        """Close one optimizer step; True when the budget is spent."""
        now, cpu = time.perf_counter(), self.cpu_used()
        wall = now - self.last_end
        train = (self.acc["training_step"] - self.acc["gen_score"]) + max(0.0, now - self.training_step_end)
        row = {
            "step": step,
            "wall_s": wall,
            "generate_s": self.acc["generate"],
            "verify_s": self.acc["verify"],
            "train_s": train,
            "other_s": wall - self.acc["generate"] - self.acc["verify"] - train,
            "cpu_s": cpu,
            "step_cpu_s": cpu - self.last_cpu,
        }
        self.steps.append(row)
        self.acc = dict.fromkeys(self.acc, 0.0)
        self.last_end, self.last_cpu = now, cpu
        if row["cpu_s"] >= self.budget_cpu_s:
            self.stop_reason = f"CPU budget {self.budget_cpu_s:g}s reached"
            return True
        return False


# GRPOTrainer methods timed into StepClock.acc: generation, rewards, the two together (so the training
# pass is training_step less them), and training_step itself (its end also marks where the train time
# of the step's tail - optimizer, callbacks - starts).
TIMED = {
    "_generate": "generate",
    "_calculate_rewards": "verify",
    "_generate_and_score_completions": "gen_score",
    "training_step": "training_step",
}


def timed_trainer(base: type, clock: StepClock) -> type:
    """A subclass of `base` whose TIMED methods add their wall time to `clock`."""

    def wrap(name: str, key: str) -> Any:
        method = getattr(base, name)

        def timed(self: Any, *a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return method(self, *a, **k)
            finally:
                end = time.perf_counter()
                if key == "training_step":
                    clock.training_step_end = end
                clock.add(key, end - t)

        return timed

    return type(f"Timed{base.__name__}", (base,), {name: wrap(name, key) for name, key in TIMED.items()})


def draw_tasks(cfg: Any, n_steps: int) -> list[Any]:
    """The train tasks posttrain's loop would draw, step after step, from a pool with the run's seed."""
    from posttrain.tasks.pool import TaskPool

    pool = TaskPool(cfg.tasks, seed=cfg.run.seed)
    out: list[Any] = []
    for _ in range(n_steps):
        out.extend(pool.draw(cfg.rollout.prompts_per_step))
    return out


def prompt_rows(tasks: list[Any]) -> dict[str, list[Any]]:
    """The training dataset's columns: each task's chat messages (TRL renders them with the tokenizer's
    chat template, as posttrain's engine does: tests/bench/test_peer.py checks the token ids) and its
    index into `tasks` (what the reward function scores against)."""
    from posttrain.engine.base import text_chat

    return {"prompt": [text_chat(t.prompt) for t in tasks], "task_index": list(range(len(tasks)))}


def trl_prompt_ids(tokenizer: Any, prompts: list[Any]) -> list[list[int]]:
    """The prompt token ids TRL's GRPOTrainer generates from for conversational `prompts`: its own
    `_tokenize_prompts`, on a stand-in for the trainer with the attributes that method reads (no
    chat-template override, no tools, no environments, a text model)."""
    from types import SimpleNamespace

    from trl import GRPOTrainer

    trainer = SimpleNamespace(
        processing_class=tokenizer,
        chat_template=None,
        chat_template_kwargs={},
        tools=None,
        environment_factories=None,
        _is_vlm=False,
    )
    ids = GRPOTrainer._tokenize_prompts(trainer, prompts)[0]
    return [[int(i) for i in row] for row in ids]


def reward_function(tasks: list[Any], max_tokens: int, eos_ids: set[int]) -> Any:
    """A TRL reward function scoring each completion with its task's posttrain verifier."""
    from posttrain.pipeline.workers import verify_one
    from posttrain.types import Episode

    def posttrain_verifier(prompts, completions, completion_ids, task_index, **_: Any) -> list[float | None]:
        out: list[float | None] = []
        for completion, ids, i in zip(completions, completion_ids, task_index):
            text = completion[-1]["content"] if isinstance(completion, list) else completion
            cut = len(ids) >= max_tokens and (not ids or ids[-1] not in eos_ids)
            verdict = verify_one(tasks[i], Episode(text, finish_reason="length" if cut else "stop"))
            out.append(None if verdict.score is None else verdict.score.value)
        return out

    return posttrain_verifier


def trl_config(cfg: Any, args: argparse.Namespace, max_steps: int, max_tokens: int) -> Any:
    from trl import GRPOConfig

    loss = cfg.trainer.loss
    g, prompts = cfg.rollout.group_size, cfg.rollout.prompts_per_step
    rows = g * prompts  # one optimizer step per posttrain step: prompts x G completions, generated at once
    micro = args.micro_batch or rows
    if rows % micro:
        raise SystemExit(f"peer_trl: --micro-batch {micro} does not divide the step's {rows} rows")
    return GRPOConfig(
        output_dir=args.out,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        seed=args.seed,
        data_seed=args.seed,
        learning_rate=cfg.trainer.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=cfg.trainer.betas[0],
        adam_beta2=cfg.trainer.betas[1],
        weight_decay=cfg.trainer.weight_decay,
        max_grad_norm=cfg.trainer.grad_clip,
        # micro-batches of `micro` rows, their gradients accumulated (grpo's loss: each micro-batch's row
        # mean / the accumulation steps, so the step's loss is the mean over all its rows as in one pass);
        # steps_per_generation follows gradient_accumulation_steps: one generation of all rows a step
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=rows // micro,
        num_generations=g,
        num_iterations=1,
        max_completion_length=max_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        beta=cfg.trainer.kl_coef,
        loss_type=loss.type,
        epsilon=loss.clip_low,
        epsilon_high=loss.clip_high,
        scale_rewards="none" if loss.type == "dr_grpo" else "group",
        shuffle_dataset=False,  # posttrain's draw order
        remove_unused_columns=False,  # the reward function reads task_index
        max_steps=max_steps,
        save_strategy="steps" if args.save_every else "no",
        save_steps=args.save_every or 500,
        save_only_model=True,
        save_total_limit=None,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        log_completions=False,
    )


def lora_config(cfg: Any) -> Any:
    """peft's LoraConfig for the posttrain config's trainer.lora (None: full fine-tuning, no adapter):
    the one posttrain.trainer.lora.apply_lora gives peft (`peft_config`), on a causal LM (the task
    type TRL's generation and loss take the PeftModel through)."""
    if cfg.trainer.lora is None:
        return None
    from posttrain.trainer.lora import peft_config

    return peft_config(cfg.trainer.lora, task_type="CAUSAL_LM")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PrinterCallback, TrainerCallback
    from trl import GRPOTrainer

    from posttrain.configs import load_config
    from posttrain.model.arch import load_tokenizer
    from posttrain.model.real import resolve
    from posttrain.pipeline.budget import domain_budgets
    from posttrain.pipeline.workers import configure_pool
    from posttrain.tasks.pool import TaskPool

    cfg = load_config(args.config, [*args.overrides, f"run.seed={args.seed}", f"run.threads={args.threads}"])
    configure_pool(cfg.sandbox.pool_config())  # the sandbox the code verifiers run in, as posttrain's loop sets it
    probe = TaskPool(cfg.tasks, seed=cfg.run.seed)
    budgets = domain_budgets(probe.names, probe.specs, cfg.rollout.max_tokens)
    max_tokens = max(b.tokens for b in budgets.values())
    if any(b.turns > 1 for b in budgets.values()):
        raise SystemExit("peer_trl: multi-turn domains are not part of this comparison")
    max_steps = max(1, math.ceil(args.budget_cpu_s / args.min_step_s))
    tasks = draw_tasks(cfg, max_steps)
    dataset = Dataset.from_dict(prompt_rows(tasks))

    model = AutoModelForCausalLM.from_pretrained(resolve(args.model), dtype=torch.float32, local_files_only=True)
    tokenizer = load_tokenizer(args.model)  # as posttrain loads it: whitespace survives
    eos = {tokenizer.eos_token_id}
    clock = StepClock(args.budget_cpu_s)

    Timed = timed_trainer(GRPOTrainer, clock)

    trl_logs: list[dict[str, Any]] = []

    from peer import Profiler  # bench/ is this script's folder: py-spy on this process while it trains

    profiler = Profiler()

    class Budget(TrainerCallback):
        def on_train_begin(self, a, state, control, **kw):
            profiler.start()
            clock.start()

        def on_step_end(self, a, state, control, **kw):
            if clock.end_step(state.global_step):
                profiler.stop()
                control.should_training_stop = True

        def on_log(self, a, state, control, logs=None, **kw):
            if logs:
                trl_logs.append({"step": state.global_step, **{k: v for k, v in logs.items() if _number(v)}})

    trainer = Timed(
        model=model,
        reward_funcs=reward_function(tasks, max_tokens, eos),
        args=trl_config(cfg, args, max_steps, max_tokens),
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Budget()],
        peft_config=lora_config(cfg),  # posttrain's trainer.lora: the same adapters on both sides
    )
    trainer.remove_callback(PrinterCallback)  # the loss dicts go to trl.json, not the log
    trainer.train()
    cpu_used = clock.cpu_used()
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = Path(args.out)
    trainer.save_model(str(out / "final"))
    tokenizer.save_pretrained(str(out / "final"))
    steps_done = len(clock.steps)
    summary = {
        "system": "trl",
        "trl_version": __import__("trl").__version__,
        "torch_version": torch.__version__,
        "seed": args.seed,
        "threads": args.threads,
        "budget_cpu_s": args.budget_cpu_s,
        "cpu_s": cpu_used,
        "children_cpu_s": children_cpu.ru_utime + children_cpu.ru_stime,
        "steps": steps_done,
        "stop_reason": clock.stop_reason or f"max_steps {max_steps} reached",
        "peak_rss_mib": peak_rss_mib,
        "max_tokens": max_tokens,
        "micro_batch": args.micro_batch,
        "lora": None if cfg.trainer.lora is None else cfg.trainer.lora.model_dump(mode="json"),
        "task_ids": [t.id for t in tasks[: steps_done * cfg.rollout.prompts_per_step]],
        "step_rows": clock.steps,
        "logs": trl_logs,
        "checkpoints": {int(p.name.split("-")[1]): str(p) for p in out.glob("checkpoint-*")},
        "final": str(out / "final"),
    }
    (out / "trl.json").write_text(json.dumps(summary, indent=1))
    print(f"trl: {steps_done} steps, {cpu_used:.1f} CPU-s, peak RSS {peak_rss_mib:.0f} MiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
