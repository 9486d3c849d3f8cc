"""The embedded base past the positions it learned: plain RoPE against linear, dynamic and yarn
scaling (issue 39 item 2; `base.rope_scaling`, docs/models.md "Longer context").

The base is a config's cached embedded base (configs/default.yaml's, the demo's, by default);
nothing is trained or built here: each scaling is that base's weights loaded with the RoPE
settings `posttrain base build` would write for `base.rope_scaling={type: T, factor: F}`
(`rope_settings`), exactly what the built folder would hold.

The text is the pretraining text of the base's own domains (a user question and its gold
answer under the chat template), from the eval split, so the questions are not ones it was
trained on. Two settings of the same conversations:
- alone: each conversation by itself (as in pretraining; the longest is printed: the
  distances the base learned), from position 0 and shifted to start further on;
- packed: conversations one after another in one sequence of --length tokens, so the later
  ones sit at positions and distances the base never saw.
The figure is the mean negative log-likelihood (nats per token) of the answer tokens: alone, with
the conversation's first token at each of --offsets (position ids shifted, nothing before it),
and packed, by where the answer sits in the row.

    OMP_NUM_THREADS=1 .venv/bin/python bench/rope_positions.py       # about a minute on 1 thread
    OMP_NUM_THREADS=1 .venv/bin/python bench/rope_positions.py --config configs/long.yaml --factor 8
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import time

import torch


def conversations(cfg, tok, n: int) -> list[tuple[list[int], list[int]]]:
    """(ids, answer mask) of `n` eval-split conversations of the base's domains, round robin."""
    from posttrain.domains.registry import get

    names = sorted(cfg.domains)
    out = []
    for i in range(n):
        name = names[i % len(names)]
        domain = get(name)
        task = domain.sample(i // len(names), "eval", 1 + (i // len(names)) % cfg.domains[name])
        chat = [{"role": "user", "content": task.prompt[-1].content}]
        prompt = tok.encode(tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False))
        answer = tok.encode(domain.gold(task), add_special_tokens=False) + [tok.eos_token_id]
        out.append((prompt + answer, [0] * len(prompt) + [1] * len(answer)))
    return out


def nll(model, ids: list[int], mask: list[int], offset: int = 0) -> torch.Tensor:
    """Per-token negative log-likelihood of `ids[1:]` placed from position `offset` on, zero
    where `mask[1:]` is 0."""
    positions = torch.arange(offset, offset + len(ids))[None]
    with torch.no_grad():
        logits = model(torch.tensor([ids]), position_ids=positions).logits[0, :-1].float()
    per = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="none")
    return per * torch.tensor(mask[1:], dtype=torch.float)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/default.yaml", help="whose cached base (its `base` section)")
    ap.add_argument("--length", type=int, default=4096, help="tokens of each packed sequence")
    ap.add_argument("--sequences", type=int, default=3, help="packed sequences")
    ap.add_argument("--factor", type=float, default=8.0, help="scaling factor (learned: max_positions / factor)")
    ap.add_argument("--edges", default="512,2048,4096", help="position buckets of the packed answers")
    ap.add_argument("--offsets", default="0,1000,4000,8000", help="first positions of the conversations alone")
    ap.add_argument("--alone", type=int, default=200, help="conversations scored alone at each offset")
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    from transformers import AutoConfig, AutoModelForCausalLM

    from posttrain.configs import load_config
    from posttrain.model.arch import load_tokenizer, rope_settings
    from posttrain.model.pretrain import default_dir, is_cached

    base = load_config(args.config).base
    if not is_cached(base):
        raise SystemExit(f"{default_dir(base)} is not built here: `posttrain base build {args.config}`")
    folder = default_dir(base)
    tok = load_tokenizer(folder)
    edges = [int(e) for e in args.edges.split(",")]

    convs = conversations(base, tok, 4000)
    packed, k = [], 0
    for _ in range(args.sequences):
        ids: list[int] = []
        mask: list[int] = []
        starts: list[tuple[int, int]] = []  # (start in the packed row, index in convs)
        while k < len(convs) and len(ids) + len(convs[k][0]) <= args.length:
            starts.append((len(ids), k))
            ids += convs[k][0]
            mask += convs[k][1]
            k += 1
        packed.append((ids, mask, starts))
    used = {k for _, _, starts in packed for _, k in starts}
    offsets = [int(o) for o in args.offsets.split(",")]
    longest = max(len(c[0]) for c in convs)

    variants: dict[str, tuple[int, dict]] = {"plain (as built)": rope_settings(base)}
    for kind in ("linear", "dynamic", "yarn"):
        scaled = base.model_validate({**base.model_dump(), "rope_scaling": {"type": kind, "factor": args.factor}})
        variants[f"{kind} x{args.factor:g}"] = rope_settings(scaled)

    print(
        f"base {folder.name} ({base.preset}, max_positions {base.max_positions}); pretraining-style conversations "
        f"of the eval split: longest {longest} tokens (what the base learned); {len(packed)} packed rows of "
        f"{args.length} tokens, {len(used)} conversations"
    )
    buckets = list(zip([0] + edges[:-1], edges))
    head = ["rope"] + [f"alone from {o}" for o in offsets] + [f"packed {a}-{b}" for a, b in buckets]
    print("mean NLL of the answer tokens, nats per token (lower is better)")
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for label, (positions, rope) in variants.items():
        began = time.perf_counter()
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
        config.max_position_embeddings = positions
        config.rope_parameters = rope
        model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, config=config).eval()
        alone = []
        for offset in offsets:
            scored = [(nll(model, *convs[k], offset=offset), sum(convs[k][1])) for k in range(args.alone)]
            alone.append(f"{sum(float(t.sum()) for t, _ in scored) / sum(n for _, n in scored):.3f}")
        sums = [[0.0, 0] for _ in buckets]
        for ids, mask, _ in packed:
            per = nll(model, ids, mask)
            for pos in torch.nonzero(torch.tensor(mask[1:])).flatten().tolist():
                for b, (lo, hi) in enumerate(buckets):
                    if lo <= pos + 1 < hi:
                        sums[b][0] += float(per[pos])
                        sums[b][1] += 1
        cells = [f"{s / n:.3f}" if n else "-" for s, n in sums]
        print(" | ".join([label, *alone, *cells]) + f"   ({time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
