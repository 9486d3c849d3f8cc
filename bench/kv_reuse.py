"""Context reuse across turns (engine.context_reuse, issue 27 item 5): multi-turn episodes through
the staged pipeline with the hf engine computing every turn's whole prompt (off) against keeping
each episode's KV cache between its turns (on), side by side in one run: prompt tokens computed
and new per turn (the engine's own counts, per rollout as the trace stores them), the wall time
of the episodes, whether the completions are identical, and each side's peak RSS.

Domains: lookup (its own budget: 3 turns, 12 tokens per turn), the document-fields loop
(doc_invoice_fields_text: extract, read the validator's complaints, re-extract; 3 turns) and a
tool world (tool_transfer, capped at 3 turns here), the last two at 48 tokens per turn. Greedy
(temperature 0), G samples per task. The model: the embedded micro preset pretrained on lookup
transcripts (its cached base; built on first use in about a minute), 8,192 positions so the
tool world's ~4k-token prompts fit. Each side runs in its own child process (spawned), the
sides alternate `--repeats` times; wall times are the median, peak RSS the child's own.

    OMP_NUM_THREADS=1 .venv/bin/python bench/kv_reuse.py                      # ~2 min on 2 shared cores
    OMP_NUM_THREADS=1 .venv/bin/python bench/kv_reuse.py --tasks 8 --group 3   # ~1 min (bench/RESULTS.md)
    OMP_NUM_THREADS=1 .venv/bin/python bench/kv_reuse.py --suite feedback --tasks 8 --group 3

Columns: "new" counts each episode's first prompt and then its observations; "on/needed" is
the prompt tokens computed with reuse over the new ones less the first prompts a group-mate
computed (prefix sharing): 1.00 when each prompt token of an episode is computed once.

`--suite feedback`: the four feedback tiers (code_fix, term_fix, doc_fix, geo_fix, docs/feedback.md),
each at its own budget (3 turns; 32 tokens a turn, geo_fix 16), `--tasks` tasks each, on the base
of configs/feedback.yaml (its cached base; built on first use).

`--prefill`: chunked prefill (engine.prefill_chunk_tokens, issue 39 item 3) instead of the
episodes: the prompt forward's peak memory and CPU time against prompt length, one forward
(None) against chunks of 2,048 (the default) and 512 positions, each point in a child forked
for it alone (its peak RSS, VmHWM, reset just before the call; allocations of 64 KiB or more
returned to the kernel on free, so freed heap does not hide a peak). One call of two prompts,
of L and L/2 tokens (a batch of mixed lengths is left-padded, which is where one forward's
attention holds L x L scores per head: a lone unpadded prompt takes torch's fused kernel), and
a lone prompt of L; max_tokens 1; the micro preset with random weights and 8,192 positions.
"max |dlp|" is the largest gap of the first tokens' log-probs from one forward's.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/kv_reuse.py --prefill   # ~70 s

`--ratio DOMAINS`: prompt tokens computed over the tokens each episode needs computed (its new
tokens less a group-mate's shared first prompt), per domain: 4 tasks x 3 episodes stepped by the
driver's own functions, T = 1, stop strings so that actions end early and episodes run 3 turns,
on a random micro model (no base to build: the feedback tiers' base takes over 15 minutes here).
1.00 when every prompt token is computed once.

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python bench/kv_reuse.py --ratio lookup,code_fix,term_fix,doc_fix,geo_fix

With this base the document-fields actions repeat one character until the token budget
truncates them, which ends those episodes after one turn: their row shows reuse changing
nothing where there is no second turn.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import time
from collections import defaultdict
from typing import Any

from common import (  # bench/common.py: this script runs with bench/ first on sys.path
    in_child,
    map_large_allocations,
    reset_peak_kb,
    status_kb,
)

DOMAINS = {"lookup": None, "doc_invoice_fields_text": 48, "tool_transfer": 48}
"""Each domain and its tokens per turn (None: the domain's own budget)."""
SHARE = {"lookup": 1.0, "doc_invoice_fields_text": 0.5, "tool_transfer": 0.25}
"""Tasks of each domain, as a share of --tasks."""


FEEDBACK = {"code_fix": None, "term_fix": None, "doc_fix": None, "geo_fix": None}
"""`--suite feedback`: the feedback tiers, each at its own budget, --tasks tasks each."""


def base_config(suite: str = "default") -> Any:
    from posttrain.configs.base import BaseConfig

    if suite == "feedback":
        from pathlib import Path

        from posttrain.configs import load_config

        return load_config(str(Path(__file__).resolve().parents[1] / "configs" / "feedback.yaml"), []).base
    return BaseConfig(preset="micro", domains={"lookup": 1}, steps=400, buggy_fraction=0.75, threads=1)


def suite_domains(suite: str) -> tuple[dict[str, int | None], dict[str, float]]:
    """The suite's domains with their tokens per turn (None: own budget), and tasks as a share of --tasks."""
    if suite == "feedback":
        return FEEDBACK, dict.fromkeys(FEEDBACK, 1.0)
    return DOMAINS, SHARE


def side(reuse: bool, tasks: int, group: int, queue: Any, suite: str = "default") -> None:
    """One side, in a child process: the episodes through the pipeline; its figures on `queue`."""
    import asyncio
    import dataclasses

    import torch

    from posttrain.configs.pipeline import PipelineConfig
    from posttrain.domains.base import Budget
    from posttrain.domains.registry import get
    from posttrain.engine.hf import HFEngine, HFEngineConfig
    from posttrain.model.arch import load_model
    from posttrain.model.pretrain import ensure_base
    from posttrain.pipeline import EmbeddedWorkers, Pipeline, Scheduler
    from posttrain.types import SamplingParams

    torch.set_num_threads(1)
    model, tok = load_model(ensure_base(base_config(suite), progress=False), device="cpu")
    engine = HFEngine(model, tok, config=HFEngineConfig(context_reuse=reuse), seed=0)
    domains, share = suite_domains(suite)
    budgets = {d: Budget(turns=3, tokens=t or get(d).budget.tokens, seconds=600.0) for d, t in domains.items()}
    work = [get(d).sample(i, "train", 1) for d in domains for i in range(max(1, int(tasks * share[d])))]
    cfg = PipelineConfig(execute_workers=2, backoff_s=0.0, generate_batch=64, max_inflight=64)
    params = SamplingParams(max_tokens=12, temperature=0.0, n=group)
    sched = Scheduler(cfg, dict.fromkeys(domains, 1.0), dict.fromkeys(domains, "short"))
    workers = EmbeddedWorkers(engine)

    async def go() -> Any:
        async with Pipeline(cfg, workers, params, sched, seed=0, budgets=budgets) as pipe:
            return await pipe.run_groups(work, prefix="g"), pipe.stats().flat()

    t0 = time.perf_counter()
    try:
        groups, flat = asyncio.run(go())
    finally:
        workers.close()
    wall = time.perf_counter() - t0
    rows = []
    for g in groups:
        for j, r in enumerate(g.rollouts):
            rows.append(
                {
                    "shared": len(r.completion.prompt_ids) if j else 0,
                    "id": r.id,
                    "domain": r.task.domain,
                    "turns": int(r.timings.get("turns", 0)),
                    "computed": int(r.timings["prompt_computed"]),
                    "new": int(r.timings["prompt_new"]),
                    "context": len(r.completion.prompt_ids) + len(r.completion.token_ids),
                    "tokens": list(r.completion.token_ids),
                }
            )
    st = engine.stats()
    queue.put(
        {
            "reuse": reuse,
            "wall_s": wall,
            "rows": rows,
            "engine_prompt_tokens": st.prompt_tokens,
            "engine_prompt_reused": st.prompt_reused,
            "engine_generated": st.generated_tokens,
            "pipe_prompt_computed": flat["pipe_prompt_computed"],
            "pipe_prompt_new": flat["pipe_prompt_new"],
            "sessions": dataclasses.asdict(st.sessions) if st.sessions else None,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
    )


def run_side(reuse: bool, tasks: int, group: int, suite: str = "default") -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=side, args=(reuse, tasks, group, queue, suite))
    proc.start()
    got = queue.get()
    proc.join()
    return got


def table(off: dict[str, Any], on: dict[str, Any]) -> list[str]:
    """Per domain (and its 3-turn episodes): turns, prompt tokens computed and new per turn."""
    out = [
        "| domain | episodes | turns | final contexts | new | computed off | computed on "
        "| off/on | on/new | on/needed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    groups: dict[str, list[tuple[dict, dict]]] = defaultdict(list)
    for a, b in zip(off["rows"], on["rows"], strict=True):
        groups[a["domain"]].append((a, b))
        if a["turns"] == 3:
            groups[f"{a['domain']} (3-turn episodes)"].append((a, b))
    groups["all"] = [p for k, v in groups.items() if "(" not in k for p in v]
    for name, pairs in groups.items():
        turns = sum(a["turns"] for a, _ in pairs)
        new = sum(a["new"] for a, _ in pairs)
        c_off, c_on = sum(a["computed"] for a, _ in pairs), sum(b["computed"] for _, b in pairs)
        ctx = sum(a["context"] for a, _ in pairs)
        needed = new - sum(b["shared"] for _, b in pairs)
        out.append(
            f"| {name} | {len(pairs)} | {turns} | {ctx:,} | {new:,} ({new / turns:.0f}/turn) | "
            f"{c_off:,} ({c_off / turns:.0f}/turn) | {c_on:,} ({c_on / turns:.0f}/turn) | "
            f"{c_off / max(1, c_on):.2f}x | {c_on / max(1, new):.2f} | {c_on / max(1, needed):.2f} |"
        )
    return out


def _prefill_measure(spec: dict[str, Any]) -> dict[str, Any]:
    """In a forked child: one engine call of `spec["rows"]` prompts (L, L/2, ...), its CPU time,
    its peak RSS over the RSS before it, and the first tokens' log-probs."""
    import torch

    from posttrain.engine.hf import HFEngine, HFEngineConfig
    from posttrain.model.arch import random_model
    from posttrain.types import GenerationRequest, SamplingParams

    map_large_allocations()
    torch.set_num_threads(1)
    cfg = HFEngineConfig(prefill_chunk_tokens=spec["chunk"], max_batch_tokens=1 << 30, **spec.get("engine", {}))
    if spec.get("model"):
        eng = HFEngine.from_pretrained(spec["model"], device="cpu", config=cfg, seed=0)
        tok = eng.tokenizer
    else:
        model, tok = random_model(spec.get("preset", "micro"), 0, max_positions=8192)
        eng = HFEngine(model, tok, config=cfg, seed=0)
    one = SamplingParams(max_tokens=spec.get("max_tokens", 1), temperature=0.0, n=spec.get("n", 1))
    if spec.get("domain"):  # real prompts: task i of the family at this length, chat template applied
        from posttrain.domains.registry import get

        dom = get(f"{spec['domain']}@{spec['length']}")
        reqs = [GenerationRequest(eng.encode_chat(dom.sample(i, "eval", 2).prompt), one) for i in range(spec["rows"])]
    else:
        g = torch.Generator().manual_seed(0)
        ids = tuple(torch.randint(10, len(tok) - 5, (spec["length"],), generator=g).tolist())
        reqs = [GenerationRequest(ids[: len(ids) // (k + 1)], one) for k in range(spec["rows"])]
    eng.generate([GenerationRequest(reqs[0].prompt_ids[:32], SamplingParams(max_tokens=1))])  # lazy set-up
    base = reset_peak_kb()
    started = time.process_time()
    out = eng.generate(reqs)
    seconds = time.process_time() - started
    hwm = status_kb("VmHWM")
    return {
        "cpu_s": seconds,
        "call_mb": (hwm - base) / 1024,
        "peak_mb": hwm / 1024,
        "logprobs": [g[0].logprobs[0] for g in out],
        "tokens": [list(c.token_ids) for g in out for c in g],
        "prompt_tokens": sum(len(r.prompt_ids) for r in reqs),
    }


def _fork(spec: dict[str, Any]) -> dict[str, Any]:
    """`_prefill_measure` in a forked child (bench/common.py in_child: its own peak RSS)."""
    return in_child(_prefill_measure, spec)


def prefill_table(lengths: list[int], chunks: list[int | None], rows: int, engine: dict[str, Any]) -> list[str]:
    """Per prompt length: CPU s, the call's MB over its start and the child's peak RSS, per chunk
    setting; and the largest first-token log-prob gap from one forward (chunks[0])."""
    names = ["one forward" if c is None else f"chunks of {c}" for c in chunks]
    out = [
        "| L | " + " | ".join(f"{n}: CPU s, call MB, peak MB" for n in names) + " | max abs dlp |",
        "|---:|" + "---:|" * (len(chunks) + 1),
    ]
    for length in lengths:
        got = [_fork({"length": length, "chunk": c, "rows": rows, "engine": engine}) for c in chunks]
        gap = max(abs(a - b) for r in got[1:] for a, b in zip(got[0]["logprobs"], r["logprobs"]))
        cells = [f"{r['cpu_s']:.2f} s, {r['call_mb']:.0f}, {r['peak_mb']:.0f}" for r in got]
        out.append(f"| {length:,} | " + " | ".join(cells) + f" | {gap:.1e} |")
    return out


def int8_table(lengths: list[int], spec: dict[str, Any]) -> list[str]:
    """Per prompt length: kv_dtype auto against int8 on the same call (`spec`), CPU s, the call's
    MB over its start, the child's peak RSS; the KV slab's own MB (computed from the shapes); and
    how far int8 moves the outputs: greedy completions identical, largest first-token log-prob gap."""
    out = [
        "| L | prompt tokens | auto: CPU s, call MB, peak MB | int8: CPU s, call MB, peak MB | KV slab MB auto / int8 "
        "| identical greedy | max abs dlp |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for length in lengths:
        a, b = (_fork({**spec, "length": length, "engine": {"kv_dtype": kind}}) for kind in ("auto", "int8"))
        gap = max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"]))
        same = sum(x == y for x, y in zip(a["tokens"], b["tokens"]))
        slab = [_slab_mb(spec, a["prompt_tokens"], int8) for int8 in (False, True)]
        cells = [f"{r['cpu_s']:.2f} s, {r['call_mb']:.0f}, {r['peak_mb']:.0f}" for r in (a, b)]
        out.append(
            f"| {length:,} | {a['prompt_tokens']:,} | {cells[0]} | {cells[1]} | {slab[0]:.0f} / {slab[1]:.0f} "
            f"| {same}/{len(a['tokens'])} | {gap:.1e} |"
        )
    return out


def _slab_mb(spec: dict[str, Any], prompt_tokens: int, int8: bool) -> float:
    """MB of the KV slabs of `spec`'s call: rows x (longest prompt + max_tokens) positions per layer,
    keys and values; float32, or int8 plus one float32 scale per head_dim values (the shapes of
    the micro or tiny preset, or the model folder's config)."""
    from posttrain.model.arch import PRESETS

    if spec.get("model"):
        import json as _json
        from pathlib import Path

        c = _json.loads((Path(spec["model"]) / "config.json").read_text())
        layers, kv, hd = c["num_hidden_layers"], c["num_key_value_heads"], c["hidden_size"] // c["num_attention_heads"]
    else:
        hidden, layers, heads, kv, _ = PRESETS[spec.get("preset", "micro")]
        hd = hidden // heads
    rows = spec["rows"] * spec.get("n", 1)
    positions = rows * (prompt_tokens // spec["rows"] + spec.get("max_tokens", 1))  # prompts of one length
    per_value = 1 + 4 / hd if int8 else 4
    return positions * layers * 2 * kv * hd * per_value / 2**20


def ratio_main(names: list[str]) -> None:
    """`--ratio`: per domain, episodes, turns, prompt tokens computed, new and needed."""
    import torch

    from posttrain.domains.registry import get
    from posttrain.engine.hf import HFEngine
    from posttrain.envs import driver
    from posttrain.model.arch import random_model
    from posttrain.types import SamplingParams

    torch.set_num_threads(1)
    model, tok = random_model("micro", 0, max_positions=8192)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # wide weights: greedy paths vary, eos and the stop strings are reachable
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=7, stop=tuple("aeiostnp%"))
    print("| domain | episodes | turns | computed | new | needed | computed / needed |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        eng, dom, trajs = HFEngine(model.eval(), tok, seed=1), get(name), []
        for task in [dom.sample(i, "train", 1) for i in range(4)]:
            envs = driver.open_envs(dom, task, 3)
            ts = driver.start(envs, task, [eng.encode_chat(driver.first_messages(task, o)) for _, o in envs], 3)
            while any(not t.done for t in ts):
                reqs, targets = driver.requests(ts, params, 7, task.id)
                driver.generate_each(eng.generate, reqs, targets)
                for t in (t for group in targets for t in group):
                    driver.step(t)
                    driver.observe(t, eng.encode_chat)
            eng.end_sessions(driver.session_keys(task.id, 3))
            driver.close_envs(e for e, _ in envs)
            trajs += ts
        computed, new = sum(t.prompt_computed for t in trajs), sum(t.prompt_new for t in trajs)
        needed = new - sum(len(t.prompt_ids) for j, t in enumerate(trajs) if j % 3)
        turns = sum(len(t.turns) for t in trajs)
        print(f"| {name} | {len(trajs)} | {turns} | {computed:,} | {new:,} | {needed:,} | {computed / needed:.3f} |")


def prefill_main(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    import torch  # imported once here: every forked point inherits it (a fresh import per point cost ~8 s)

    from posttrain.engine.hf import HFEngine
    from posttrain.model.arch import random_model

    torch.set_num_threads(1)
    HFEngine(*random_model("micro", 0), seed=0)
    lengths = [int(x) for x in args.lengths.split(",")]
    chunks: list[int | None] = [None, 2048, 512]
    print(f"1. two prompts (L and L/2, left-padded), one call, max_tokens 1; chunks {chunks}")
    print("\n".join(prefill_table(lengths, chunks, 2, {})))
    print("\n2. one prompt of L (no padding)")
    print("\n".join(prefill_table(lengths[-2:], chunks, 1, {})))
    tiny = {"preset": "tiny", "rows": 1, "n": 16, "max_tokens": 16, "chunk": 2048}
    print("\n3. kv_dtype auto against int8: one prompt of L random tokens, 16 samples (prefix sharing), 16 greedy")
    print("tokens each, the tiny preset (4 layers, 2 kv heads of 32), random weights")
    print("\n".join(int8_table(lengths[-3:], tiny)))
    if args.model:
        real = {"model": args.model, "rows": 8, "max_tokens": 24, "chunk": 2048, "domain": "keychain"}
        print(f"\n4. kv_dtype auto against int8 on {args.model}: 8 keychain@L eval prompts (level 2), greedy")
        print("\n".join(int8_table([int(x) for x in args.model_lengths.split(",")], real)))
    print(f"\nwall {time.perf_counter() - started:.0f} s")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=16, help="lookup tasks (documents: half, tools: a quarter)")
    ap.add_argument("--group", type=int, default=4, help="episodes per task (G)")
    ap.add_argument("--repeats", type=int, default=2, help="times each side runs (alternating)")
    ap.add_argument("--suite", choices=("default", "feedback"), default="default", help="which domains (see above)")
    ap.add_argument("--prefill", action="store_true", help="chunked prefill's memory against prompt length")
    ap.add_argument("--lengths", default="512,1024,2048,4096,8000", help="with --prefill: prompt lengths")
    ap.add_argument("--model", help="with --prefill: also int8 against auto on this model folder (keychain prompts)")
    ap.add_argument("--model-lengths", default="1000,4000,8000", help="with --model: keychain@L lengths")
    ap.add_argument("--ratio", metavar="DOMAINS", help="prompt tokens computed over needed per domain (see above)")
    args = ap.parse_args(argv)
    if args.ratio:
        ratio_main(args.ratio.split(","))
        return
    if args.prefill:
        prefill_main(args)
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from posttrain.model.pretrain import ensure_base

    ensure_base(base_config(args.suite), progress=False)  # build once, before the timed children
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for _ in range(args.repeats):
        for reuse in (False, True):
            runs[reuse].append(run_side(reuse, args.tasks, args.group, args.suite))
    off, on = runs[False][0], runs[True][0]
    same = sum(a["tokens"] == b["tokens"] for a, b in zip(off["rows"], on["rows"], strict=True))
    steady = all(r["rows"] == runs[k][0]["rows"] for k in runs for r in runs[k])
    wall = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
    what = f"{args.tasks} tasks per tier" if args.suite == "feedback" else f"{args.tasks} lookup tasks and the rest"
    print(f"{len(off['rows'])} episodes ({what}, G={args.group}), greedy")
    print("\n".join(table(off, on)))
    print(
        f"engine prompt tokens computed: off {off['engine_prompt_tokens']:,}, on {on['engine_prompt_tokens']:,} "
        f"(+{on['engine_prompt_reused']:,} reused); pipeline counters: new {on['pipe_prompt_new']:,.0f}, "
        f"computed off {off['pipe_prompt_computed']:,.0f} / on {on['pipe_prompt_computed']:,.0f}"
    )
    print(f"sessions (on): {json.dumps(on['sessions'])}")
    print(f"identical completions: {same}/{len(off['rows'])}; every repeat identical: {steady}")
    print(
        f"wall (median of {args.repeats}): off {wall[False]:.2f} s, on {wall[True]:.2f} s "
        f"({wall[False] / wall[True]:.2f}x); each: off {[round(r['wall_s'], 2) for r in runs[False]]}, "
        f"on {[round(r['wall_s'], 2) for r in runs[True]]}"
    )
    print(
        f"peak RSS: off {max(r['peak_rss_mib'] for r in runs[False]):.0f} MiB, "
        f"on {max(r['peak_rss_mib'] for r in runs[True]):.0f} MiB (each side's child process)"
    )


if __name__ == "__main__":
    main()
