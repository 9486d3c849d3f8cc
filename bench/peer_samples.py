"""The two samplers of the TRL comparison on the same prompts: posttrain's hf engine against
transformers' `generate` called as TRL's GRPOTrainer calls it.

bench/peer_grad.py shows the two trainers make the same update of the same samples; what is left
of the per-step gap is the samples. This draws them from the base model on one step's prompts of the
`real` mix (bench/peer.py), `--reps` times 4 samples a prompt from each sampler (T and top-p from
configs/real.yaml, top-k off, up to the config's max_tokens), scores every completion with
posttrain's verifiers (the TRL side's reward function) and prints each side's mean reward, per
prompt, its mean length and how many completions the token cap cut. The hf engine samples each
prompt's group with its own seed; `generate` takes all prompts' rows in one left-padded batch, as
TRL does. Run it in the peer venv (`make bench-peer`):

    PYTHONPATH=src .venv-peer/bin/python bench/peer_samples.py --seed 2 --reps 4
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/peer_samples.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0, help="the run seed whose first step's prompts are drawn")
    p.add_argument("--reps", type=int, default=4, help="rounds of 4 samples a prompt on each side")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from peer import MIXES
    from peer_grad import padded
    from peer_trl import draw_tasks, prompt_rows, reward_function, trl_prompt_ids
    from transformers import AutoModelForCausalLM

    from posttrain.configs import load_config
    from posttrain.engine.hf import HFEngine
    from posttrain.model.arch import load_tokenizer
    from posttrain.model.real import resolve
    from posttrain.pipeline.workers import configure_pool
    from posttrain.types import GenerationRequest, SamplingParams

    cfg = load_config(ROOT / "configs" / "real.yaml", [*MIXES["real"].overrides, f"run.seed={args.seed}"])
    configure_pool(cfg.sandbox.pool_config())
    g, temp, top_p, cap = 4, cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_tokens
    tasks = draw_tasks(cfg, 1)[: cfg.rollout.prompts_per_step]
    tok = load_tokenizer(cfg.model.path)
    eos = {int(tok.eos_token_id)}
    path = resolve(cfg.model.path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).eval()
    ids = trl_prompt_ids(tok, prompt_rows(tasks)["prompt"])
    sides: dict[str, list[list[list[int]]]] = {}

    engine, t0 = HFEngine(model, tok, seed=0), time.perf_counter()
    rows: list[list[list[int]]] = [[] for _ in tasks]
    for r in range(args.reps):
        reqs = [
            GenerationRequest(
                tuple(q), SamplingParams(max_tokens=cap, temperature=temp, top_p=top_p, n=g, seed=1000 * r + i)
            )
            for i, q in enumerate(ids)
        ]
        for i, group in enumerate(engine.generate(reqs)):
            rows[i] += [list(c.token_ids) for c in group]
    sides["posttrain hf engine"] = rows
    print(f"hf engine: {time.perf_counter() - t0:.1f} s", flush=True)

    pad = tok.pad_token_id if tok.pad_token_id is not None else min(eos)
    x, mask = padded([q for q in ids for _ in range(g)], pad, left=True)
    width = x.shape[1]
    rows, t0 = [[] for _ in tasks], time.perf_counter()
    for r in range(args.reps):
        torch.manual_seed(5000 + r)
        with torch.no_grad():
            y = model.generate(
                x,
                attention_mask=mask,
                do_sample=True,
                temperature=temp,
                top_p=top_p,
                top_k=0,
                max_new_tokens=cap,
                pad_token_id=pad,
                eos_token_id=sorted(eos),
            )
        for k, seq in enumerate(y[:, width:].tolist()):
            rows[k // g].append(seq[: next((j + 1 for j, t in enumerate(seq) if t in eos), len(seq))])
    sides["transformers generate (TRL's call)"] = rows
    print(f"generate: {time.perf_counter() - t0:.1f} s", flush=True)

    score = reward_function(tasks, cap, eos)
    for side, groups in sides.items():
        per = []
        for i, comps in enumerate(groups):
            got = score(None, [tok.decode([t for t in c if t not in eos]) for c in comps], comps, [i] * len(comps))
            per.append([0.0 if v is None else float(v) for v in got])
        values = [v for row in per for v in row]
        lens = [len(c) for comps in groups for c in comps]
        cut = sum(1 for comps in groups for c in comps if len(c) >= cap and c[-1] not in eos)
        print(
            f"{side}: reward mean {sum(values) / len(values):.3f}, per prompt "
            f"{[round(sum(row) / len(row), 2) for row in per]}, mean length {sum(lens) / len(lens):.1f}, "
            f"cut at {cap}: {cut} of {len(lens)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
