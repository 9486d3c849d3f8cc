"""`posttrain sft`: supervised fine-tuning on demonstrations, top to bottom.

Invariant: the run directory is a `posttrain train` run directory in every part it shares with
one: `config.yaml` (resolved), `metrics.jsonl` (one `sft` row per optimizer step), `heldout.json`
and `eval.json` (the held-out sets and tables of `tasks.domains`, built and evaluated by the same
`RunEvaluator` as a train run, before and after), and `checkpoints/step_N/` written by
`save_checkpoint` (Hugging Face weights and tokenizer, optimizer, RNG, loop state, manifest), so
`posttrain train ... model.path=RUN/checkpoints/step_N` starts RL from the fine-tuned weights.
Only assistant tokens enter the loss (sft/data.py); the run is seeded (`run.seed`: torch, numpy and python
RNGs, and each epoch's order of batches) and single-process. `cpu_s` in each row is this process's CPU
time since the first step (the clock of `run.cpu_budget_s`), so an SFT run and an RL run can be
compared at equal CPU.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: no spinning threads under load
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from posttrain.configs import Config
from posttrain.evaluate import EvalTable
from posttrain.metrics_log import MetricsLog
from posttrain.rundir import RunDir
from posttrain.sft.data import Demo, Demos, length_batches, load_demos


@dataclass(frozen=True)
class SftResult:
    run_dir: Path
    checkpoint: Path
    """The final checkpoint: the `model.path` a following `posttrain train` starts from."""
    steps: int
    first_loss: float
    """The loss over the first tenth of the steps (one step at least), each assistant token
    weighing the same (`loss_window`): one batch's loss moves with what the batch holds."""
    last_loss: float
    """The same over the last tenth."""
    cpu_s: float
    """CPU seconds of the fine-tuning steps (evaluations and loading outside)."""
    before: EvalTable | None
    after: EvalTable | None


def sft(cfg: Config, log: Callable[[str], Any] = print) -> SftResult:
    """Fine-tune `cfg.model.path` (or the embedded base) on `cfg.sft.data` and evaluate it
    before and after on the held-out sets of `cfg.tasks.domains`."""
    import torch

    from posttrain.trainer.checkpoint import seed_everything

    torch.set_num_threads(cfg.run.threads)
    seed_everything(cfg.run.seed)
    model, tokenizer, model_dir = _load(cfg)
    demos = load_demos(cfg.sft, tokenizer, getattr(model.config, "max_position_embeddings", None))
    rundir = RunDir.create(cfg)
    log(f"sft: {model_dir} -> {rundir.path}\n{demos.summary()}")
    _report_bad(demos, rundir.path, log)
    metrics = MetricsLog(rundir.metrics_path)
    evaluator = _evaluator(cfg, rundir.path, model, tokenizer, metrics, log) if cfg.sft.evaluate else None
    if evaluator is not None:
        _overlap(demos, evaluator.heldout, tokenizer, rundir.path, log)
    before = _evaluate(evaluator, 0, "before fine-tuning", log)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=cfg.sft.lr, weight_decay=cfg.sft.weight_decay
    )
    steps, rows, cpu_s = _fit(cfg, model, tokenizer, optimizer, demos, rundir.path, metrics)
    checkpoint = _save(cfg, rundir.path, model, tokenizer, optimizer, steps, cpu_s, demos)
    if evaluator is not None:
        evaluator.engine.update_weights(None)  # the engine shares the module: weights changed in place
    after = _evaluate(evaluator, steps, "after fine-tuning", log)
    if evaluator is not None and before is not None and after is not None:
        evaluator.write(rundir.eval_path, before, after, [])
        log("held-out before and after fine-tuning:\n" + evaluator.describe(before, after))
    metrics.close()
    first, last, n = loss_window(rows)
    log(
        f"sft: {steps} steps, loss {first:.4f} -> {last:.4f} (mean over the first and the last {n} "
        f"step{'s' if n > 1 else ''}), {cpu_s:.1f} CPU-s; checkpoint {checkpoint}"
    )
    reuse = f" eval.before_from={rundir.path}" if after is not None else ""  # its final table: the RL run's before
    log(f"next: posttrain train CONFIG model.path={checkpoint}{reuse}")
    return SftResult(rundir.path, checkpoint, steps, first, last, cpu_s, before, after)


def loss_window(rows: Sequence[dict[str, Any]]) -> tuple[float, float, int]:
    """The loss over the first and over the last tenth of the steps' metric rows (one step at
    least), each assistant token weighing the same, and that tenth's steps: a length batch holds
    one kind of row, so one step's loss says what that batch was more than how far the fit went."""
    n = max(1, len(rows) // 10)

    def mean(part: Sequence[dict[str, Any]]) -> float:
        return sum(r["loss"] * r["loss_tokens"] for r in part) / sum(r["loss_tokens"] for r in part)

    return mean(rows[:n]), mean(rows[-n:]), n


def _load(cfg: Config) -> tuple[Any, Any, Path]:
    import torch

    from posttrain.model.arch import load_model
    from posttrain.model.pretrain import ensure_base

    model_dir = Path(cfg.model.path or ensure_base(cfg.base, progress=cfg.run.progress))
    device = ("cuda" if torch.cuda.is_available() else "cpu") if cfg.model.device == "auto" else cfg.model.device
    model, tokenizer = load_model(model_dir, device=device, dtype=getattr(torch, cfg.model.dtype))
    return model, tokenizer, model_dir


def _report_bad(demos: Demos, run_dir: Path, log: Callable[[str], Any]) -> None:
    """Every rejected row, logged (the first 20) and written to RUN_DIR/rejected.txt."""
    if not demos.bad:
        return
    lines = [f"{demos.path}: {bad}" for bad in demos.bad]
    (run_dir / "rejected.txt").write_text("\n".join(lines) + "\n")
    more = f"\n... and {len(lines) - 20} more (all in {run_dir / 'rejected.txt'})" if len(lines) > 20 else ""
    log(f"warning: {len(lines)} {demos.unit}s rejected, the rest train:\n" + "\n".join(lines[:20]) + more)


def _evaluator(cfg: Config, run_dir: Path, model: Any, tokenizer: Any, metrics: MetricsLog, log: Any) -> Any:
    from posttrain.engine.hf import HFEngine
    from posttrain.evaluate.run import RunEvaluator
    from posttrain.tasks.pool import TaskPool

    pool = TaskPool(cfg.tasks, seed=cfg.run.seed)  # validates the domain names
    levels = {name: pool.eval_difficulty(name) for name in pool.names}
    return RunEvaluator(cfg, run_dir, HFEngine(model, tokenizer, seed=cfg.run.seed), metrics, levels, log)


def _overlap(demos: Demos, heldout: Any, tokenizer: Any, run_dir: Path, log: Callable[[str], Any]) -> None:
    """How many held-out core items a demonstration's opening prompt equals token for token (the
    prompt before its first assistant turn against the item's `chat_ids`): logged, and written to
    RUN_DIR/checks.json as `sft_overlap` (a fine-tuned score on such items is not held-out)."""
    import json

    from posttrain.engine.base import chat_ids

    prompts = {d.ids[: d.mask.index(True)] for d in demos.demos}
    found = {}
    for name, s in heldout.of_kind("core").items():
        hits = sum(chat_ids(tokenizer, t.prompt) in prompts for t in s.tasks())
        found[name] = {"overlap": hits, "eval_tasks": s.n}
    (run_dir / "checks.json").write_text(json.dumps({"sft_overlap": found}, indent=1))
    bad = [f"{name} ({r['overlap']}/{r['eval_tasks']})" for name, r in found.items() if r["overlap"]]
    log("demonstrations vs held-out prompts: " + (f"OVERLAP in {', '.join(bad)}" if bad else "no overlap"))


def _evaluate(evaluator: Any, step: int, when: str, log: Callable[[str], Any]) -> EvalTable | None:
    if evaluator is None:
        return None
    table: EvalTable = evaluator.full(step)
    log(f"held-out {when}:\n" + evaluator.describe(table))
    return table


def _fit(
    cfg: Config, model: Any, tokenizer: Any, optimizer: Any, demos: Demos, run_dir: Path, metrics: MetricsLog
) -> tuple[int, list[dict[str, Any]], float]:
    """The optimizer steps: each epoch's length batches in a seeded order; a row of metrics per
    step, a checkpoint every `sft.checkpoint_every`; the LM head in chunks and gradient
    checkpointing as `trainer.logits_chunk_mib` and `trainer.gradient_checkpointing` say. Returns
    steps, each step's metric row, CPU seconds."""
    from posttrain.progress import progress
    from posttrain.trainer.chunked import chunk_positions
    from posttrain.trainer.trainer import split_head

    s = cfg.sft
    epochs = [length_batches(demos.demos, s.batch_tokens, cfg.run.seed + e) for e in range(s.epochs)]
    total = sum(map(len, epochs)) if s.max_steps is None else min(s.max_steps, sum(map(len, epochs)))
    bar = progress(total, "sft", disable=not cfg.run.progress)
    head = split_head(model)
    chunk = chunk_positions(cfg.trainer.logits_chunk_mib, int(model.get_input_embeddings().num_embeddings))
    if cfg.trainer.gradient_checkpointing:  # as the trainer's: decoder layers recomputed in backward, dropout off
        from posttrain.trainer.memory import enable_gradient_checkpointing

        enable_gradient_checkpointing(model)
    model.train()
    t0, step, rows = time.process_time(), 0, []
    for epoch, batches in enumerate(epochs):
        for batch in batches:
            if step >= total:
                break
            step += 1
            lr = _lr(s.lr, s.warmup_steps, step)
            row = _step(model, optimizer, batch, lr, s.grad_clip, tokenizer.pad_token_id, head, chunk)
            rows.append(row)
            metrics.write("sft", step, epoch=epoch, cpu_s=time.process_time() - t0, **row)
            bar.set_postfix_str(f"loss={row['loss']:.4f}")
            bar.update(1)
            if s.checkpoint_every and step % s.checkpoint_every == 0 and step < total:
                _save(cfg, run_dir, model, tokenizer, optimizer, step, time.process_time() - t0, demos)
    bar.close()
    model.eval()
    return step, rows, time.process_time() - t0


def _lr(lr: float, warmup: int, step: int) -> float:
    return lr * min(1.0, step / warmup) if warmup else lr


def _step(
    model: Any,
    optimizer: Any,
    batch: Sequence[Demo],
    lr: float,
    clip: float,
    pad_id: int,
    head: tuple[Any, Any] | None = None,
    chunk: int | None = None,
) -> dict[str, Any]:
    """One AdamW step on `batch`: the mean cross-entropy over its assistant tokens (each token's
    loss weighs the same whichever row it is in). With `head` (`split_head`: the model is
    lm_head(decoder output)), only the positions that predict an assistant token reach the LM
    head, `chunk` of them at a time (trainer/chunked.py, trainer.logits_chunk_mib): no
    rows x length x vocabulary tensor, the prompts' positions never through the head; without,
    the model's whole logits. The loss is the same up to float rounding."""
    import torch

    from posttrain.trainer.chunked import token_logp_entropy

    ids_bt, mask_bt, attn_bt = _pad(batch, pad_id, next(model.parameters()).device)
    for group in optimizer.param_groups:
        group["lr"] = lr
    target_bt, loss_bt = ids_bt[:, 1:], mask_bt[:, 1:]
    if head is not None:
        decoder, lm_head = head
        hidden_bth = decoder(input_ids=ids_bt, attention_mask=attn_bt, use_cache=False).last_hidden_state[:, :-1]
        target_n = target_bt[loss_bt]
        ones_n = torch.ones(target_n.shape[0], device=target_n.device)
        logp_n, _ = token_logp_entropy(lm_head, hidden_bth[loss_bt], target_n, ones_n, chunk)
        tokens = loss_bt.sum()
        loss = -logp_n.sum() / tokens
    else:
        logits_btv = model(input_ids=ids_bt, attention_mask=attn_bt).logits[:, :-1].float()
        nll_bt = torch.nn.functional.cross_entropy(logits_btv.transpose(1, 2), target_bt, reduction="none")
        tokens = loss_bt.sum()
        loss = (nll_bt * loss_bt.float()).sum() / tokens
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    return {
        "loss": float(loss.detach()),
        "grad_norm": float(grad_norm),
        "lr": lr,
        "rows": len(batch),
        "loss_tokens": int(tokens),
        "padded_tokens": int(ids_bt.numel()),
    }


def _pad(batch: Sequence[Demo], pad_id: int, device: Any) -> tuple[Any, Any, Any]:
    """Right-padded ids, loss mask and attention mask (batch x time)."""
    import torch

    width = max(len(d.ids) for d in batch)
    ids_bt = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask_bt = torch.zeros((len(batch), width), dtype=torch.bool)
    attn_bt = torch.zeros((len(batch), width), dtype=torch.long)
    for i, d in enumerate(batch):
        ids_bt[i, : len(d.ids)] = torch.tensor(d.ids)
        mask_bt[i, : len(d.ids)] = torch.tensor(d.mask)
        attn_bt[i, : len(d.ids)] = 1
    return ids_bt.to(device), mask_bt.to(device), attn_bt.to(device)


def _save(
    cfg: Config, run_dir: Path, model: Any, tokenizer: Any, optimizer: Any, step: int, cpu_s: float, demos: Demos
) -> Path:
    from posttrain.trainer.checkpoint import save_checkpoint

    state = {"step": step, "sft": {"data": demos.path, "demos": len(demos.demos), "cpu_s": cpu_s}}
    return save_checkpoint(run_dir, model, tokenizer, optimizer, state, step, keep=cfg.sft.keep_checkpoints)
