"""Trainer memory and time against context length, side by side in one run (issue 39 item 4).

Each point is one forward+backward of the trainer's loss path (`Trainer._accumulate`: the
decoder, the LM head on the loss positions, log-softmax, entropy, the GRPO loss, backward into
every parameter; no optimizer step) in a child process forked for that point alone, so its peak
RSS is its own: the kernel's high-water mark (VmHWM) is reset just before the pass, and
"loss path MB" is that peak minus the RSS before the pass (model, trainer, inputs). Every
allocation of 64 KiB or more is its own mapping, returned to the kernel on free
(M_MMAP_THRESHOLD), so the baseline holds no freed heap a pass could reuse unseen and the
figures repeat to a few MB (with glibc's default, retained heap moved them by up to 130 MB).
"CPU s" is the child's user + system CPU time of the pass (1 thread), so other load on the
machine does not count; the allocator setting adds page-fault time to both sides. The model is a tiny LlamaForCausalLM
with SmolLM2-135M's vocabulary (49,152 tokens, tied embeddings; hidden 64, 2 layers), so the
LM head's logits dominate memory as in the real model; the real 538 MB model is not loaded.

Tables:
1. context length (one row of a 16-token prompt and L - 16 completion tokens, all in the
   loss): the LM head at once (`logits_chunk_mib: null`, the behaviour before) against in
   chunks of 64 MiB (the default); the one-pass side stops at --one-pass-max tokens.
2. vocabulary size at one length: the loss path's peak with the head at once grows with the
   vocabulary, in chunks it stays flat (the chunk is a fixed number of bytes).
3. packing on a mixed-length batch (20 rows of 16 to 384 tokens) on a model whose decoder
   weighs as much as its head (hidden 256, 4 layers, vocabulary 8,192): right-padded in one
   pass, the default padding-aware micro-batches (`micro_batch_size: auto`), and packed rows
   (`packing_tokens: 1024`), each with its loss to show they agree.

    OMP_NUM_THREADS=1 .venv/bin/python bench/long_context.py          # about 2 minutes
    OMP_NUM_THREADS=1 .venv/bin/python bench/long_context.py --lengths 256,1024,4096,16384 --one-pass-max 4096
    OMP_NUM_THREADS=1 .venv/bin/python bench/long_context.py --only-real \
        --real ~/.cache/posttrain/models/smollm2-135m-instruct     # tables 4 and 5: the real model

4. the real SmolLM2-135M-Instruct, table 1's two sides (about 2 minutes).
5. one `posttrain sft` step on the real model (sft/run.py `_step`, AdamW, one demonstration
   of each long family at L, 4L and 8L in one padded batch): the model's whole logits against
   the LM head on the assistant positions only, in 64 MiB chunks, and that with gradient
   checkpointing (`trainer.gradient_checkpointing`, the trainer's `enable_gradient_checkpointing`);
   `--sft-modes` picks the columns (default all three).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse
import random
import time
from typing import Any

import torch
from common import (  # bench/common.py: this script runs with bench/ first on sys.path
    in_child,
    map_large_allocations,
    reset_peak_kb,
    status_kb,
)

from posttrain.configs.trainer import TrainerConfig
from posttrain.trainer.batch import TrainBatch, TrainRow
from posttrain.trainer.trainer import Trainer

SMOLLM2_VOCAB = 49_152
PROMPT = 16


def _llama(vocab: int, hidden: int = 64, layers: int = 2, positions: int = 32_768) -> Any:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=positions,
        tie_word_embeddings=True,
    )
    return AutoModelForCausalLM.from_config(config)


def _rows(lengths: list[int], vocab: int, seed: int = 0) -> TrainBatch:
    """One row per length (16-token prompt, the rest completion, every token in the loss), all
    in one group with rewards alternating 0/1, so every row carries signal."""
    rng = random.Random(seed)
    rows = []
    for i, n in enumerate(lengths):
        prompt = tuple(rng.randrange(vocab) for _ in range(PROMPT))
        completion = tuple(rng.randrange(vocab) for _ in range(n - PROMPT))
        rows.append(TrainRow(prompt, completion, (-10.0,) * len(completion), float(i % 2), 0, (1,) * len(completion)))
    if len(rows) == 1:  # a group of one has advantage 0: add a zero-length partner with the other reward
        rows.append(TrainRow(rows[0].prompt_ids, (), (), 1.0 - rows[0].reward, rows[0].group_id, ()))
    return TrainBatch(tuple(rows))


def _measure(spec: dict[str, Any]) -> dict[str, Any]:
    """In the child: build the model and trainer, then one timed forward+backward."""
    map_large_allocations()
    if spec.get("real"):
        from posttrain.model.arch import load_model

        model, _ = load_model(spec["real"])
    else:
        model = _llama(spec["vocab"], spec.get("hidden", 64), spec.get("layers", 2))
    trainer = Trainer(model, TrainerConfig(**spec["config"]))
    batch = _rows(spec["lengths"], spec["vocab"])
    prepared = trainer._prepare(batch)
    passes = len(trainer._micro_batches(prepared))
    base = reset_peak_kb()
    started = time.process_time()
    acc = trainer._accumulate(prepared)
    seconds = time.process_time() - started
    grads_mb = sum(p.grad.numel() * 4 for p in trainer.params if p.grad is not None) / 2**20
    return {
        "seconds": seconds,
        "peak_mb": status_kb("VmHWM") / 1024,
        "loss_path_mb": (status_kb("VmHWM") - base) / 1024,
        "grads_mb": grads_mb,
        "loss": acc.loss,
        "passes": passes,
        "chunk": trainer._chunk,
    }


def _point(spec: dict[str, Any]) -> dict[str, Any]:
    """`_measure` in a forked child (bench/common.py in_child: its own peak RSS)."""
    return in_child(_measure, spec)


ONE_PASS = {"logits_chunk_mib": None}
CHUNKED: dict[str, Any] = {}  # the defaults: 64 MiB chunks


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return f"{'-':>8} {'-':>9} {'-':>10}"
    return f"{r['seconds']:8.2f} {r['loss_path_mb']:9.0f} {r['peak_mb']:10.0f}"


def by_length(lengths: list[int], one_pass_max: int) -> None:
    print(f"\n1. context length, vocabulary {SMOLLM2_VOCAB:,} (one row; CPU s, loss-path MB, peak RSS MB)")
    print(
        f"{'tokens':>7} | {'one pass: s':>11} {'loss MB':>9} {'peak MB':>10} | "
        f"{'chunked: s':>10} {'loss MB':>9} {'peak MB':>10}"
    )
    for n in lengths:
        spec = {"vocab": SMOLLM2_VOCAB, "lengths": [n]}
        whole = _point({**spec, "config": ONE_PASS}) if n <= one_pass_max else None
        chunked = _point({**spec, "config": CHUNKED})
        if whole is not None and abs(whole["loss"] - chunked["loss"]) > 1e-5:
            raise SystemExit(f"length {n}: losses differ ({whole['loss']} vs {chunked['loss']})")
        print(f"{n:7d} | {_cell(whole):>31} | {_cell(chunked)}")


def by_vocab(vocabs: list[int], length: int) -> None:
    print(f"\n2. vocabulary size at {length} tokens (loss-path MB includes the parameter gradients, grads MB)")
    print(
        f"{'vocab':>7} {'grads MB':>8} | {'one pass: s':>11} {'loss MB':>9} {'peak MB':>10} | "
        f"{'chunked: s':>10} {'loss MB':>9} {'peak MB':>10} {'chunk':>6}"
    )
    for v in vocabs:
        spec = {"vocab": v, "lengths": [length]}
        whole, chunked = _point({**spec, "config": ONE_PASS}), _point({**spec, "config": CHUNKED})
        print(f"{v:7d} {chunked['grads_mb']:8.1f} | {_cell(whole):>31} | {_cell(chunked)} {chunked['chunk']:6d}")


def packing(rows: int, shortest: int, longest_row: int, capacity: int) -> None:
    rng = random.Random(1)
    lengths = [rng.randint(shortest, longest_row) for _ in range(rows)]
    model = {"vocab": 8192, "hidden": 256, "layers": 4, "lengths": lengths}
    total, longest = sum(lengths), max(lengths)
    print(
        f"\n3. packing: {rows} rows of {shortest}-{longest_row} tokens ({total:,} tokens; padded to the longest: "
        f"{rows * longest:,}); hidden 256, 4 layers, vocabulary 8,192"
    )
    print(f"{'layout':<34} {'passes':>6} {'CPU s':>7} {'speed-up':>8} {'peak MB':>8} {'loss':>12}")
    cases = [
        ("right-padded, one pass", {"micro_batch_size": rows}),
        ("padding-aware micro-batches (auto)", {}),
        (f"packed, packing_tokens={capacity}", {"packing_tokens": capacity}),
    ]
    first = None
    for name, cfg in cases:
        r = _point({**model, "config": cfg})
        first = first or r
        print(
            f"{name:<34} {r['passes']:6d} {r['seconds']:7.2f} {first['seconds'] / r['seconds']:7.2f}x "
            f"{r['peak_mb']:8.0f} {r['loss']:12.8f}"
        )


def real(path: str, lengths: list[int]) -> None:
    """The real SmolLM2-135M-Instruct (fp32, 538 MB), one row per length, as table 1."""
    print(f"\n4. the real SmolLM2-135M-Instruct ({path}); one row; CPU s, loss-path MB, peak RSS MB")
    print(
        f"{'tokens':>7} | {'one pass: s':>11} {'loss MB':>9} {'peak MB':>10} | "
        f"{'chunked: s':>10} {'loss MB':>9} {'peak MB':>10} {'|d loss|':>9}"
    )
    for n in lengths:
        spec = {"vocab": SMOLLM2_VOCAB, "lengths": [n], "real": path}
        whole, chunked = _point({**spec, "config": ONE_PASS}), _point({**spec, "config": CHUNKED})
        print(f"{n:7d} | {_cell(whole):>31} | {_cell(chunked)} {abs(whole['loss'] - chunked['loss']):9.1e}")


def _sft_measure(spec: dict[str, Any]) -> dict[str, Any]:
    """In the child: the real model, one `posttrain sft` step (sft/run.py `_step`, AdamW) on one
    demonstration of each long family at one length (the family's train task and gold, rendered
    as `posttrain sft` renders it), the model's whole logits or the head on the assistant
    positions in 64 MiB chunks."""
    map_large_allocations()
    from posttrain.domains.registry import get
    from posttrain.model.arch import load_model
    from posttrain.sft.data import render
    from posttrain.sft.run import _step
    from posttrain.trainer.chunked import chunk_positions
    from posttrain.trainer.trainer import split_head
    from posttrain.types import Message

    model, tok = load_model(spec["real"])
    demos = []
    for i, name in enumerate(spec["domains"]):
        dom = get(name)
        task = dom.sample(i, "train", 2)
        demos.append(render(tok, [*task.prompt, Message("assistant", dom.gold(task))], i, 32_768))
    split = spec["mode"] in ("chunked", "recompute")
    head = split_head(model) if split else None
    chunk = chunk_positions(64.0, int(model.get_input_embeddings().num_embeddings)) if split else None
    if spec["mode"] == "recompute":
        from posttrain.trainer.memory import enable_gradient_checkpointing

        enable_gradient_checkpointing(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    model.train()
    base = reset_peak_kb()
    started = time.process_time()
    row = _step(model, optimizer, demos, 1e-4, 1.0, tok.pad_token_id, head, chunk)
    seconds = time.process_time() - started
    return {
        "seconds": seconds,
        "peak_mb": status_kb("VmHWM") / 1024,
        "loss_path_mb": (status_kb("VmHWM") - base) / 1024,
        "loss": row["loss"],
        "tokens": row["padded_tokens"],
        "loss_tokens": row["loss_tokens"],
    }


SFT_MODES = {
    "whole": "whole logits",
    "chunked": "head in chunks",
    "recompute": "chunks + recompute",
}


def sft(path: str, chars: list[int], modes: list[str]) -> None:
    """One `posttrain sft` step on the real model, one demonstration of each long family at
    each context length: whole logits, the head on the assistant positions in chunks, and that
    with gradient checkpointing (the `modes` asked for, each in its own child)."""
    print(f"\n5. one `posttrain sft` step (AdamW) on the real model ({path}): keychain, vartrack and noisygraph at")
    print(
        "   level 2, one demonstration each, padded into one batch; CPU s, step MB (peak over the step), peak RSS MB;"
    )
    print(f"   |d loss| against the first column ({SFT_MODES[modes[0]]})")
    cols = " | ".join(f"{SFT_MODES[m] + ': s':>19} {'step MB':>9} {'peak MB':>10}" for m in modes)
    print(f"{'chars':>6} {'tokens':>6} {'loss':>5} | {cols} | {'|d loss|':>9}")
    for n in chars:
        names = [f"{d}@{n}" if n != 1000 else d for d in ("keychain", "vartrack", "noisygraph")]
        spec = {"real": path, "domains": names}
        got = [in_child(_sft_measure, {**spec, "mode": m}) for m in modes]
        cells = " | ".join(f"{_cell(r):>40}" for r in got)
        gaps = " ".join(f"{abs(r['loss'] - got[0]['loss']):.1e}" for r in got[1:])
        print(f"{n:6d} {got[0]['tokens']:6d} {got[0]['loss_tokens']:5d} | {cells} | {gaps:>9}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="256,512,1024,2048,4096")
    ap.add_argument("--one-pass-max", type=int, default=2048, help="longest length run with the head at once")
    ap.add_argument("--vocabs", default="8192,32768,49152,131072")
    ap.add_argument("--vocab-length", type=int, default=512)
    ap.add_argument("--pack-rows", type=int, default=20)
    ap.add_argument("--pack-min", type=int, default=16, help="shortest row of the packing batch")
    ap.add_argument("--pack-max", type=int, default=384, help="longest row of the packing batch")
    ap.add_argument("--pack-tokens", type=int, default=1024)
    ap.add_argument(
        "--real", metavar="DIR", help="also tables 4 and 5 on the real model at DIR (not in the default run)"
    )
    ap.add_argument("--real-lengths", default="256,1024", help="table 4's lengths ('': no table 4)")
    ap.add_argument("--only-real", action="store_true", help="with --real: tables 4 and 5 alone")
    ap.add_argument(
        "--sft-chars", default="1000,4000,8000", help="table 5's context lengths (characters, L = 1000; '': no table 5)"
    )
    ap.add_argument(
        "--sft-modes", default="whole,chunked,recompute", help=f"table 5's columns, of {','.join(SFT_MODES)}"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    _measure({"vocab": 256, "lengths": [32], "config": CHUNKED})  # imports and lazy set-up, inherited by every point
    if not args.only_real:
        by_length([int(x) for x in args.lengths.split(",")], args.one_pass_max)
        by_vocab([int(x) for x in args.vocabs.split(",")], args.vocab_length)
        packing(args.pack_rows, args.pack_min, args.pack_max, args.pack_tokens)
    if args.real:
        if args.real_lengths:
            real(args.real, [int(x) for x in args.real_lengths.split(",")])
        if args.sft_chars:
            modes = args.sft_modes.split(",")
            if unknown := [m for m in modes if m not in SFT_MODES]:
                ap.error(f"--sft-modes: unknown {unknown}; of {list(SFT_MODES)}")
            sft(args.real, [int(x) for x in args.sft_chars.split(",")], modes)
    print(f"\nwall {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
