"""One batch, two trainers: posttrain's gradient against TRL's GRPOTrainer's on the same rows.

bench/peer.py compares the two systems end to end, and on the real model TRL gained more per step on
some seeds (bench/RESULTS.md, "On the real model"). Every setting is aligned (loss, clip, advantages,
LoRA, Adam, prompts, verifiers), so either the update each side makes of the same 32 samples differs
or the difference is the samples. This script takes the samples out: one step's prompts (the `real`
mix's first draw), G completions each sampled from the base, scored by posttrain's verifiers, then

- posttrain: `Trainer.step` on the TrainBatch the loop would build (groups without a signal left out
  and counted, `trainer.normalise: sampled`), the gradient read just before the optimizer step;
- TRL: `GRPOTrainer.compute_loss` on the same rows in TRL's own input layout (prompts padded on the
  left, completions on the right, the mask through the first end token, advantages by TRL's
  formula: (r - mean) / (unbiased std + 1e-4) per group), backward;

both from the same adapter weights (TRL's copied from posttrain's), and prints each side's per-token
log-probs gap, the gradients' cosine and norm ratio (over all adapters and the worst per matrix). With
`--perturb-b S` the adapters' B matrices start from N(0, S) instead of 0 (a trained adapter's state,
where the gradient reaches A too). Run it in the peer venv (`make bench-peer`):

    PYTHONPATH=src .venv-peer/bin/python bench/peer_grad.py --perturb-b 0.01

Expected: cosine 1 to float rounding and a norm ratio of sqrt(G / (G - 1)) (posttrain's advantages
divide by the population std, TRL's by the unbiased one: a uniform scale Adam ignores).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench/peer_grad.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model name or folder (default: the real mix's)")
    p.add_argument("--config", default="configs/real.yaml")
    p.add_argument("--prompts", type=int, default=8, help="prompts (groups) in the batch")
    p.add_argument("--max-tokens", type=int, default=None, help="default: the config's rollout.max_tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--perturb-b", type=float, default=0.0, help="start LoRA B from N(0, S) (0: peft's zeros)")
    p.add_argument(
        "--rewards",
        choices=("verifier", "synthetic"),
        default="verifier",
        help="verifier: posttrain's verifiers score the samples; synthetic: 0/1 drawn with the seed, every "
        "group but the second with a signal (a model that solves nothing, as the tests' micro base)",
    )
    p.add_argument(
        "--trl-micro-batch",
        type=int,
        default=8,
        help="TRL's rows per forward/backward, gradients accumulated as its trainer does (bench/peer.py's real "
        "mix: 8; all 32 rows at once peaked at 18 GB RSS); 0: the whole batch at once",
    )
    p.add_argument("--json", type=Path, default=None, help="write the figures here too")
    p.add_argument("overrides", nargs="*", help="config overrides after the real mix's")
    return p.parse_args(argv)


def sample(model: Any, prompt_ids: list[list[int]], g: int, max_tokens: int, temperature: float, eos: set[int]):
    """G completions of each prompt from `model` (transformers' sampler, top-k off), each cut after its
    first end token."""
    import torch

    out: list[list[list[int]]] = []
    for ids in prompt_ids:
        x = torch.tensor([ids])
        with torch.no_grad():
            y = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=True,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_tokens,
                num_return_sequences=g,
                pad_token_id=min(eos),
            )
        rows = []
        for seq in y[:, len(ids) :].tolist():
            cut = next((i + 1 for i, t in enumerate(seq) if t in eos), len(seq))
            rows.append(seq[:cut])
        out.append(rows)
    return out


def padded(rows: list[list[int]], pad: int, left: bool) -> tuple[Any, Any]:
    """`rows` as one (ids, attention mask) pair of tensors, padded with `pad` on the left (prompts,
    as TRL generates from and scores them) or on the right (completions)."""
    import torch

    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        at = slice(width - len(row), width) if left else slice(0, len(row))
        ids[i, at] = torch.tensor(row, dtype=torch.long)
        mask[i, at] = 1
    return ids, mask


def trl_inputs(prompt_ids, completions, advantages, pad: int) -> dict[str, Any]:
    """TRL's compute_loss inputs for the rows: prompts left-padded, completions right-padded, the
    completion mask through the first end token (as `_generate_and_score_completions` builds them)."""
    import torch

    p_ids, p_mask = padded([p for p, rows in zip(prompt_ids, completions) for _ in rows], pad, left=True)
    c_ids, c_mask = padded([c for rows in completions for c in rows], pad, left=False)
    return {
        "prompt_ids": p_ids,
        "prompt_mask": p_mask,
        "completion_ids": c_ids,
        "completion_mask": c_mask,
        "advantages": torch.tensor(advantages, dtype=torch.float32),
        "old_per_token_logps": None,
    }


def trl_advantages(rewards: list[list[float]]) -> list[float]:
    """TRL 1.16's group advantages (scale_rewards="group"): (r - mean) / (unbiased std + 1e-4)."""
    import torch

    out: list[float] = []
    for group in rewards:
        r = torch.tensor(group, dtype=torch.float32)
        out.extend(((r - r.mean()) / (r.std() + 1e-4)).tolist())
    return out


def compare(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float]:
    import torch

    names = sorted(ours)
    a = torch.cat([ours[n].flatten() for n in names]).double()
    b = torch.cat([theirs[n].flatten() for n in names]).double()
    per = []
    for n in names:
        x, y = ours[n].flatten().double(), theirs[n].flatten().double()
        if x.norm() > 0 and y.norm() > 0:
            per.append((float(torch.nn.functional.cosine_similarity(x, y, dim=0)), n))
    return {
        "cosine": float(torch.nn.functional.cosine_similarity(a, b, dim=0)),
        "norm_posttrain": float(a.norm()),
        "norm_trl": float(b.norm()),
        "norm_ratio": float(a.norm() / b.norm()) if b.norm() > 0 else math.nan,
        "worst_matrix_cosine": min(per)[0] if per else math.nan,
        "worst_matrix": min(per)[1] if per else "",
        "matrices": len(names),
        "nonzero": len(per),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from peer import MIXES
    from peer_trl import draw_tasks, lora_config, prompt_rows, reward_function, trl_config, trl_prompt_ids
    from transformers import AutoModelForCausalLM

    from posttrain.configs import load_config
    from posttrain.model.arch import load_tokenizer
    from posttrain.model.real import resolve
    from posttrain.pipeline.workers import configure_pool
    from posttrain.trainer.batch import TrainBatch, TrainRow
    from posttrain.trainer.trainer import Trainer

    mix = MIXES["real"]
    cfg = load_config(ROOT / args.config, [*mix.overrides, f"run.seed={args.seed}", *args.overrides])
    configure_pool(cfg.sandbox.pool_config())
    model_name = args.model or cfg.model.path
    g, temperature = cfg.rollout.group_size, cfg.rollout.temperature
    max_tokens = args.max_tokens or cfg.rollout.max_tokens
    tasks = draw_tasks(cfg, 1 + (args.prompts - 1) // cfg.rollout.prompts_per_step)[: args.prompts]
    tokenizer = load_tokenizer(model_name)
    eos = {int(tokenizer.eos_token_id)}
    base = AutoModelForCausalLM.from_pretrained(resolve(model_name), dtype=torch.float32, local_files_only=True)
    base.eval()
    prompts = prompt_rows(tasks)
    prompt_ids = trl_prompt_ids(tokenizer, prompts["prompt"])

    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    completions = sample(base, prompt_ids, g, max_tokens, temperature, eos)
    score = reward_function(tasks, max_tokens, eos)
    rewards: list[list[float]] = []
    gen = torch.Generator().manual_seed(args.seed)
    for i, rows in enumerate(completions):
        if args.rewards == "synthetic":
            drawn = [float(x) for x in torch.randint(0, 2, (len(rows),), generator=gen).tolist()]
            drawn[0] = 1.0 - drawn[1] if i != 1 else drawn[1]  # a signal in every group but the second
            rewards.append([drawn[1]] * len(rows) if i == 1 else drawn)
            continue
        texts = [tokenizer.decode([t for t in c if t not in eos]) for c in rows]
        got = score(None, texts, rows, [i] * len(rows))
        rewards.append([0.0 if r is None else float(r) for r in got])
    print(f"sampled {args.prompts} x {g} in {time.perf_counter() - t0:.1f} s; rewards by group: {rewards}")
    signal = [i for i, r in enumerate(rewards) if max(r) != min(r)]
    if not signal:
        print("no group carries a signal: nothing to compare (another --seed)")
        return 1

    # posttrain: the trainer applies trainer.lora; B perturbed as asked, then TRL's adapters copied from it
    trainer = Trainer(copy.deepcopy(base), cfg.trainer)
    if args.perturb_b:
        gen = torch.Generator().manual_seed(args.seed + 1)
        with torch.no_grad():
            for n, p in trainer.model.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=gen) * args.perturb_b)
    adapters = {n.replace("base_model.model.", ""): p for n, p in trainer.model.named_parameters() if p.requires_grad}

    def rows_for(groups: list[int], logprobs: list[tuple[float, ...]] | None = None) -> list[Any]:
        out, k = [], 0
        for i in groups:
            for c, r in zip(completions[i], rewards[i]):
                lp = logprobs[k] if logprobs is not None else (0.0,) * len(c)
                out.append(TrainRow(tuple(prompt_ids[i]), tuple(c), lp, r, i, (1,) * len(c), temperature))
                k += 1
        return out

    # the behaviour log-probs: the trainer's own (the base sampled them; no mismatch to correct)
    behaviour = trainer.token_logprobs(rows_for(signal))
    kept = rows_for(signal, behaviour)
    dropped = [i for i in range(len(tasks)) if i not in signal]
    batch = TrainBatch(
        tuple(kept),
        filtered_rows=sum(len(completions[i]) for i in dropped),
        filtered_tokens=sum(len(c) for i in dropped for c in completions[i]),
    )
    grads: dict[str, Any] = {}
    step = trainer.optimizer.step

    def capture(*a: Any, **kw: Any) -> Any:
        grads.update({n: p.grad.detach().clone() for n, p in adapters.items()})
        return None  # no update: only the gradient is compared

    trainer.optimizer.step = capture
    t0 = time.perf_counter()
    stats = trainer.step(batch)
    trainer.optimizer.step = step
    print(f"posttrain step: {time.perf_counter() - t0:.1f} s, outcome {stats.outcome}, grad norm {stats.grad_norm:.4f}")

    # TRL: its trainer on the same base, its adapters set to posttrain's
    import tempfile

    from datasets import Dataset
    from trl import GRPOTrainer

    ns = argparse.Namespace(out=tempfile.mkdtemp(prefix="peer-grad-"), micro_batch=None, seed=args.seed, save_every=0)
    trl = GRPOTrainer(
        model=copy.deepcopy(base),
        reward_funcs=score,
        args=trl_config(cfg, ns, 1, max_tokens),
        train_dataset=Dataset.from_dict(prompts),
        processing_class=tokenizer,
        peft_config=lora_config(cfg),
    )
    theirs = {n.replace("base_model.model.", ""): p for n, p in trl.model.named_parameters() if p.requires_grad}
    if sorted(theirs) != sorted(adapters):
        raise SystemExit("peer_grad: the two sides' adapters differ by name")
    with torch.no_grad():
        for n, p in theirs.items():
            p.copy_(adapters[n])
    trl.model.train()
    inputs = trl_inputs(prompt_ids, completions, trl_advantages(rewards), tokenizer.pad_token_id or min(eos))
    rows = inputs["completion_ids"].size(0)
    micro = args.trl_micro_batch or rows
    if rows % micro:
        raise SystemExit(f"peer_grad: --trl-micro-batch {micro} does not divide the batch's {rows} rows")
    # TRL's gradient accumulation: each micro-batch's grpo loss (its row mean) over the accumulation steps
    trl.current_gradient_accumulation_steps = rows // micro
    t0, total = time.perf_counter(), 0.0
    for start in range(0, rows, micro):
        part = {k: (v[start : start + micro] if v is not None else None) for k, v in inputs.items()}
        loss = trl.compute_loss(trl.model, part)
        loss.backward()
        total += float(loss.detach())
    print(
        f"TRL compute_loss + backward ({rows // micro} x {micro} rows): "
        f"{time.perf_counter() - t0:.1f} s, loss {total:.6f}"
    )
    trl_grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().clone() for n, p in theirs.items()}
    shutil.rmtree(ns.out, ignore_errors=True)

    # the per-token log-probs each side scores the kept rows with
    with torch.no_grad():
        lp_trl, _, _ = trl._get_per_token_logps_and_entropies(
            trl.model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
            inputs["completion_ids"].size(1),
        )
    gap, k = 0.0, 0
    flat = [(i, j) for i in range(len(tasks)) for j in range(len(completions[i]))]
    ours_lp = dict(zip([f for f in flat if f[0] in signal], behaviour))
    for row, (i, j) in enumerate(flat):
        if (i, j) in ours_lp:
            n = len(completions[i][j])
            gap = max(gap, float((lp_trl[row, :n] - torch.tensor(ours_lp[(i, j)])).abs().max()))
            k += 1
    print(f"per-token log-probs, max |posttrain - TRL| over {k} rows (the adapters both sides start from): {gap:.2e}")
    figures = compare(grads, trl_grads)
    expect = math.sqrt(g / (g - 1))
    print(
        f"gradient over {figures['matrices']} adapter matrices ({figures['nonzero']} non-zero on both sides): "
        f"cosine {figures['cosine']:.6f}, worst matrix {figures['worst_matrix_cosine']:.6f} "
        f"({figures['worst_matrix']}); "
        f"norm posttrain {figures['norm_posttrain']:.4e}, TRL {figures['norm_trl']:.4e}, "
        f"ratio {figures['norm_ratio']:.4f} (sqrt(G/(G-1)) = {expect:.4f})"
    )
    if args.json:
        figures.update(logprob_gap=gap, expected_ratio=expect, rows=k, groups_with_signal=len(signal))
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
