"""Serving benchmarks: fast tier against standard tier, and a bounded load test.

speed: the same prompts through the standard tier (HFEngine) and each fast-tier
       mode (SpeculativeEngine), one request at a time, one torch thread, in one
       run; prints output tokens/s, ratios, greedy identity, acceptance and mean
       accepted length per drafter, and the held-out eval delta of the lossy int8
       mode. `--warm` first sends every prompt once through every engine, untimed,
       and resets the counters: the timed rounds then repeat prompts the fast tier
       has answered before (its model-free drafter drafts from past answers).
costs: CPU time of one lean-decoder forward feeding 1-64 tokens, float32 in both weight
       layouts and int8: what a verifying forward costs against a one-token step
       (speculation's bound: the speed-up with every draft accepted, and the mean
       accepted length a `--target` speed-up needs, at each n); `--rows R` the same
       bound for R sequences through the transformers module (the rollouts' batch,
       against `--rows-target`, 1.8);
       `--decode N` then greedy-decodes N tokens with both float layouts side by side.
load:  starts `posttrain serve` as a separate process on loopback and drives it
       with N concurrent streaming clients for a fixed number of requests;
       prints errors, p50/p99 latency and time to first token.

.venv/bin/python bench/serving.py speed --model DIR [--label TEXT] [--warm]
.venv/bin/python bench/serving.py speed --preset medium     (random weights)
.venv/bin/python bench/serving.py costs --model DIR [--decode 128] [--rows 32]
.venv/bin/python bench/serving.py load --model DIR --clients 32 --requests 256 [--serve-set fast.head=true]

With a model folder that holds a co-trained draft head (draft_head.pt: `posttrain train` with
trainer.draft_head.enabled, then `posttrain export`), `speed` adds the head modes and prints
the head's speed-up over the same lean decoder without drafts (mode 2), its mean accepted
length and its acceptance per depth; `load` serves the folder as `posttrain serve` does (with
without its head unless `--serve-set fast.head=true`) and prints the server's peak RSS.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

DOMAINS = {"add": 2, "sub": 2, "mul": 2, "reverse": 3, "sort": 3}
MODES = [  # (label, fast mode, FastTierConfig fields): exactly what `posttrain serve` builds
    ("lossless, lean target: suffix + auto draft (default)", "lossless", {}),
    ("lossless, lean target: suffix + lean-int8 draft", "lossless", {"draft_model": "lean-int8"}),
    ("lossless, lean target: no drafts", "lossless", {"ngram": False, "draft_model": "none"}),
    ("lossless, hf target: suffix + lean-int8 draft", "lossless", {"target": "hf", "draft_model": "lean-int8"}),
    ("lossless, hf target: suffix only", "lossless", {"target": "hf", "draft_model": "none"}),
    ("lossless, hf target: suffix + int8 draft (hf)", "lossless", {"target": "hf", "draft_model": "int8"}),
    ("lossy int8, lean target: suffix", "int8", {"draft_model": "none"}),
    ("lossless, lean target: lean-int8 draft only", "lossless", {"ngram": False, "draft_model": "lean-int8"}),
]
# "suffix": the model-free drafter, `fast.ngram` (serve/spec.py SuffixDrafter; before it, n-gram prompt lookup)
HEAD_MODES = [  # with the model folder's draft head (modes 8, 9); compared with mode 2, the same decoder undrafted
    ("lossless, lean target: draft head only", "lossless", {"ngram": False, "draft_model": "none", "head": True}),
    ("lossless, lean target: draft head + suffix", "lossless", {"draft_model": "none", "head": True}),
]
LATER_MODES = [  # numbered after the head modes (10, ...) whether or not the folder has a head
    ("lossless, lean target: suffix only", "lossless", {"draft_model": "none"}),
]
LEAN_UNDRAFTED = MODES[2][0]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load(args: argparse.Namespace):
    from posttrain.model.arch import load_model, random_model

    if args.model:
        return load_model(args.model)
    model, tok = random_model(args.preset, seed=0)
    return model.eval(), tok


def prompts(engine, n_per_domain: int, max_tokens: int):
    from posttrain.evaluate import eval_tasks
    from posttrain.types import GenerationRequest, SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, seed=0)
    return [
        GenerationRequest(engine.encode_chat(t.prompt), params)
        for d, lvl in DOMAINS.items()
        for t in eval_tasks(d, lvl, n_per_domain)
    ]


def set_domains(spec: str | None) -> None:
    """--domains add:1,sort:1 replaces DOMAINS (the prompts of `speed` and `load`)."""
    if spec:
        from common import domain_levels  # bench/common.py: this script runs with bench/ first on sys.path

        levels = domain_levels(spec)
        DOMAINS.clear()
        DOMAINS.update(levels)


def warm(engines: dict, reqs) -> None:
    """Every prompt once through every engine, untimed; then each engine's counters restart."""
    for r in reqs:
        for eng in engines.values():
            eng.generate([r])
    from posttrain.serve.spec import DraftStats, SpecStats, SpeculativeEngine

    for eng in engines.values():
        if isinstance(eng, SpeculativeEngine):
            eng.stats = SpecStats(drafters={n: DraftStats() for n in eng.stats.drafters})


def timed(engines: dict, reqs, rounds: int):
    """Per engine, best of `rounds` passes of tokens/s, one request at a time; the
    engines take turns prompt by prompt so a busy machine slows all alike."""
    best = {n: 0.0 for n in engines}
    best_cpu = {n: 0.0 for n in engines}
    outs: dict = {}
    for _ in range(rounds):
        secs = {n: 0.0 for n in engines}
        cpu = {n: 0.0 for n in engines}
        outs = {n: [] for n in engines}
        for r in reqs:
            for n, eng in engines.items():
                t0, c0 = time.perf_counter(), time.process_time()
                outs[n].append(eng.generate([r])[0][0])
                secs[n] += time.perf_counter() - t0
                cpu[n] += time.process_time() - c0
        for n in engines:
            tokens = sum(len(c.token_ids) for c in outs[n])
            best[n] = max(best[n], tokens / secs[n])
            best_cpu[n] = max(best_cpu[n], tokens / cpu[n])
    return best, best_cpu, outs


def prefill_seconds(model, reqs, rounds: int) -> tuple[float, float]:
    """Wall and CPU seconds (best of `rounds`) of the lean decoder's forward over every prompt,
    the first forward of each lean-target request: what the decode-phase figures leave out."""
    from posttrain.serve.lean import LeanDecoder

    decoder = LeanDecoder(model)
    decoder.forward([1])  # warm-up
    best_wall = best_cpu = float("inf")
    for _ in range(rounds):
        wall = cpu = 0.0
        for r in reqs:
            decoder.truncate(0)
            t0, c0 = time.perf_counter(), time.process_time()
            decoder.forward(list(r.prompt_ids))
            wall += time.perf_counter() - t0
            cpu += time.process_time() - c0
        best_wall, best_cpu = min(best_wall, wall), min(best_cpu, cpu)
    return best_wall, best_cpu


def speed(args: argparse.Namespace) -> None:
    import torch

    from posttrain.configs.serve import FastTierConfig
    from posttrain.engine.hf import HFEngine
    from posttrain.serve.tiers import build_fast

    torch.set_num_threads(1)
    model, tok = load(args)
    params = sum(p.numel() for p in model.parameters())
    label = args.label or (args.model or f"random {args.preset}")
    standard = HFEngine(model, tok)
    reqs = prompts(standard, args.per_domain, args.max_tokens)
    from posttrain.model.draft_head import load_if_any

    head = load_if_any(args.model, model) if args.model else None
    numbered = list(enumerate(MODES)) + [(len(MODES) + i, m) for i, m in enumerate(HEAD_MODES) if head is not None]
    numbered += [(len(MODES) + len(HEAD_MODES) + i, m) for i, m in enumerate(LATER_MODES)]
    wanted = set(args.modes.split(",")) if args.modes else None
    modes = {
        label: build_fast(model, tok, FastTierConfig(**kw), mode, 0, head if kw.get("head") else None)
        for i, (label, mode, kw) in numbered
        if wanted is None or str(i) in wanted
    }
    if args.warm:
        warm({"standard": standard, **modes}, reqs)
    best, best_cpu, outs = timed({"standard": standard, **modes}, reqs, args.rounds)
    base_tps, base_out, base_cpu = best["standard"], outs["standard"], best_cpu["standard"]
    n_tokens = sum(len(c.token_ids) for c in base_out)
    print(
        f"model: {label} ({params / 1e6:.1f}M params); {len(reqs)} prompts "
        f"({', '.join(f'{d}:{lv}' for d, lv in DOMAINS.items())}), greedy, max_tokens {args.max_tokens}, "
        f"mean output {n_tokens / len(reqs):.1f} tokens; torch threads 1; best of {args.rounds}"
        f"{'; after one untimed pass of every prompt (--warm)' if args.warm else ''}"
    )
    print("tok/s: wall clock; cpu tok/s: per CPU-second of this process (robust to other load on the machine)")
    print(
        f"{'tier / mode':52s} {'tok/s':>7s} {'ratio':>6s} {'cpu tok/s':>9s} {'ratio':>6s} {'identical':>10s} "
        f"{'tok/fwd':>7s}  acceptance"
    )
    print(
        f"{'standard (HFEngine, one request at a time)':52s} {base_tps:7.1f} {1.0:6.2f} {base_cpu:9.1f} {1.0:6.2f} "
        f"{'-':>10s} {'1.00':>7s}"
    )
    rows = {"standard": {"tok_s": base_tps, "cpu_tok_s": base_cpu}}
    for name, eng in modes.items():
        tps = best[name]
        same = sum(a.token_ids == b.token_ids for a, b in zip(outs[name], base_out))
        st = eng.stats.as_dict()
        acc = ", ".join(
            f"{d} {v['acceptance']:.2f} ({v['accepted']}/{v['proposed']}), len {v['accepted_len']:.2f}"
            for d, v in st["drafters"].items()
        )
        cpu = best_cpu[name]
        print(
            f"{name:52s} {tps:7.1f} {tps / base_tps:6.2f} {cpu:9.1f} {cpu / base_cpu:6.2f} {same:>4d}/{len(reqs):<5d} "
            f"{st['tokens_per_forward']:7.2f}  {acc}"
        )
        rows[name] = {
            "tok_s": tps,
            "ratio": tps / base_tps,
            "cpu_tok_s": cpu,
            "cpu_ratio": cpu / base_cpu,
            "identical": same,
            "n": len(reqs),
            "stats": st,
        }
    undrafted = LEAN_UNDRAFTED
    lean = [
        n
        for n, m, kw in MODES + HEAD_MODES + LATER_MODES
        if n in rows and m == "lossless" and kw.get("target", "lean") == "lean"
    ]
    if undrafted in rows and len(lean) > 1:
        # decode phase: every lean-target mode runs the same prompt forward (the same decoder on the same
        # prompt), so its cost is subtracted from each; the first token it yields is left out too
        pre_wall, pre_cpu = prefill_seconds(model, reqs, args.rounds)
        out = n_tokens - len(reqs)

        def decode(name: str, key: str, pre: float) -> float:
            return out / (n_tokens / rows[name][key] - pre)

        print(
            f"decode phase (the lean prompt forward, {pre_wall:.2f} s wall / {pre_cpu:.2f} s CPU for all {len(reqs)} "
            f"prompts, and its first token left out), over '{undrafted}':"
        )
        for name in lean:
            w = decode(name, "tok_s", pre_wall) / decode(undrafted, "tok_s", pre_wall)
            c = decode(name, "cpu_tok_s", pre_cpu) / decode(undrafted, "cpu_tok_s", pre_cpu)
            rows[name]["decode_ratio"], rows[name]["decode_cpu_ratio"] = w, c
            print(f"  {name:52s} {w:5.2f}x wall {c:5.2f}x cpu")
    for name, _, _ in HEAD_MODES if head is not None else []:
        if name in rows and undrafted in rows:
            h = rows[name]["stats"]["drafters"]["head"]
            depth = ", ".join(f"d{i + 1} {a:.2f}" for i, a in enumerate(h["acceptance_at"]))
            print(
                f"{name}: {rows[name]['tok_s'] / rows[undrafted]['tok_s']:.2f}x wall, "
                f"{rows[name]['cpu_tok_s'] / rows[undrafted]['cpu_tok_s']:.2f}x cpu over '{undrafted}'; "
                f"mean accepted length {h['accepted_len']:.2f}; acceptance per depth {depth}"
            )
    if args.batched:
        t0 = time.perf_counter()
        outs = standard.generate(reqs)
        tps = sum(len(g[0].token_ids) for g in outs) / (time.perf_counter() - t0)
        print(
            f"{'standard, all prompts in one batch':52s} {tps:7.1f} {tps / base_tps:6.2f}  (aggregate throughput, not "
            "per stream)"
        )
    if args.gate_tasks:
        gate(model, tok, args.gate_tasks)
    print(f"peak RSS {peak_rss_mb():.0f} MB")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": label, "params": params, "rows": rows}, indent=2))


def gate(model, tok, tasks: int) -> None:
    """Held-out accuracy per domain: standard tier against the lossy int8 mode."""
    from posttrain.configs.serve import FastTierConfig
    from posttrain.engine.hf import HFEngine
    from posttrain.evaluate import evaluate
    from posttrain.serve.tiers import build_fast

    std = evaluate(HFEngine(model, tok), DOMAINS, tasks)
    lossy = evaluate(
        build_fast(model, tok, FastTierConfig(target="lean", draft_model="none"), "int8", 0), DOMAINS, tasks
    )
    cells = []
    for d in DOMAINS:
        s, f = std.results[d].accuracy, lossy.results[d].accuracy
        cells.append(f"{d} {s:.2f}->{f:.2f} ({(f - s) * 100:+.1f} pt)")
    worst = min((lossy.results[d].accuracy - std.results[d].accuracy) * 100 for d in DOMAINS)
    print(
        f"eval delta of lossy int8 mode ({tasks} held-out tasks/domain, greedy): {'; '.join(cells)}; "
        f"worst {worst:+.1f} pt -> gate (within 1 pt) {'PASSES' if worst >= -1 else 'FAILS'}"
    )


# -- forward costs -------------------------------------------------------------


def costs(args: argparse.Namespace) -> None:
    """CPU milliseconds of one lean-decoder forward feeding n tokens after `--context` cached
    positions (best of `--reps`), float32 and int8: a verifying forward of a k-token draft feeds
    k + 1, so speculation's decode speed-up is at most (tokens emitted per forward) x cost(1) /
    cost(k + 1); and the int8 draft's step cost against the target's (what `auto` compares)."""
    import torch

    from posttrain.serve.lean import LeanDecoder

    torch.set_num_threads(1)
    model, _ = load(args)
    label = args.model or f"random {args.preset}"
    print(f"model: {label}; lean decoder, one torch thread, {args.context} cached positions, best of {args.reps}")
    vocab = model.config.vocab_size
    prefix = [(7 * i) % (vocab - 1) + 1 for i in range(args.context)]
    variants = {  # label: LeanDecoder keywords
        "fp32": {},
        "fp32 (out, in)": {"layout": "out_in"},  # the weights as the module holds them (F.linear): before 2026-12-06
        "int8": {"int8": True},
    }
    measured: dict[str, dict[int, float]] = {}  # label -> n -> CPU seconds
    for label, kw in variants.items():
        decoder = LeanDecoder(model, **kw)
        decoder.forward(prefix)  # cached once: each timed forward writes only past it
        cost = measured[label] = {}
        for n in (1, 2, 3, 4, 6, 8, 11, 64):
            best = float("inf")
            for _ in range(args.reps):
                decoder.truncate(args.context)
                c0 = time.process_time()
                decoder.forward([(i % (vocab - 1)) + 1 for i in range(n)])
                best = min(best, time.process_time() - c0)
            cost[n] = best
        print(f"{label}: " + "  ".join(f"n={n} {c * 1000:6.1f} ms ({c / cost[1]:.2f})" for n, c in cost.items()))
        del decoder
    base = {label: cost[1] for label, cost in measured.items()}
    print(
        f"int8 / fp32 at n=1: {base['int8'] / base['fp32']:.2f}; fp32 (in, out) / (out, in) at n=1: "
        f"{base['fp32'] / base['fp32 (out, in)']:.2f}; peak RSS {peak_rss_mb():.0f} MB"
    )
    speculation_bound(measured["fp32"], args.target)
    if args.rows:
        batch_costs(model, args.rows, args.context, args.reps, args.rows_target)
    if args.decode:
        decode_layouts(model, prefix, args.decode, args.reps)


def speculation_bound(cost: dict[int, float], target: float) -> None:
    """What speculation can give over the same decoder at these forward costs. A verifying
    forward feeding n tokens (the last token and n - 1 drafts) emits at most n, so with every
    draft accepted and drafts free the decode speed-up is n x cost(1) / cost(n); reaching
    `target` needs a mean accepted length (tokens emitted per verifying forward, the bonus
    token included) of target x cost(n) / cost(1), which must not exceed n, and so each draft
    token accepted at `per_token` of it."""
    one = cost[1]
    print(f"speculation's bound at these costs (free drafts), and the mean accepted length {target}x needs:")
    for n, c in cost.items():
        if n == 1:
            continue
        need = target * c / one
        share = "more than n: out of reach" if need > n else f"each draft token accepted at >= {per_token(need, n):.2f}"
        print(
            f"  n={n:3d} ({n - 1} drafts): every draft accepted {n * one / c:5.2f}x; "
            f"{target}x needs {need:5.2f} of {n} tokens a forward ({share})"
        )
    best3 = max(3 * one / c for n, c in cost.items() if n >= 3)
    print(f"  at a mean accepted length of 3: at most {best3:.2f}x")


def per_token(length: float, n: int) -> float:
    """The acceptance a of each draft token (independent, the chain stopping at the first rejection)
    whose mean accepted length over a forward of n tokens, (1 - a**n) / (1 - a), is `length`."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        a = (lo + hi) / 2
        if (n if a == 1.0 else (1 - a**n) / (1 - a)) < length:
            lo = a
        else:
            hi = a
    return hi


def batch_costs(model, rows: int, context: int, reps: int, target: float) -> None:
    """The same bound for the hf engine's batched forward (what speculative rollouts verify
    with): `rows` sequences of `context` cached positions each fed n tokens, transformers'
    module with its dynamic cache, one torch thread, best of `reps`."""
    import torch
    from transformers import DynamicCache

    vocab = model.config.vocab_size
    ids = torch.tensor([[(7 * i + r) % (vocab - 1) + 1 for i in range(context)] for r in range(rows)])
    cost: dict[int, float] = {}
    with torch.no_grad():
        cache = DynamicCache()
        model(input_ids=ids, past_key_values=cache, use_cache=True)  # cached once, cropped back each time
        for n in (1, 2, 3, 4, 6, 8):
            best = float("inf")
            for _ in range(reps):
                fed = torch.full((rows, n), 5)
                c0 = time.process_time()
                model(input_ids=fed, past_key_values=cache, use_cache=True)
                best = min(best, time.process_time() - c0)
                cache.crop(-n)  # back to the `context` cached positions
            cost[n] = best
    print(
        f"transformers forward, {rows} rows x {context} cached positions, one torch thread, best of {reps}: "
        + "  ".join(f"n={n} {c * 1000:.0f} ms ({c / cost[1]:.2f})" for n, c in cost.items())
        + f"; peak RSS {peak_rss_mb():.0f} MB"
    )
    speculation_bound(cost, target)


def decode_layouts(model, prefix: list[int], tokens: int, rounds: int) -> None:
    """Greedy decoding of `tokens` tokens after `prefix` with the lean decoder's two float
    layouts, alternating for `rounds` rounds: CPU tokens/s of each (best round), their ratio,
    and whether the tokens are the same."""
    from posttrain.serve.lean import LeanDecoder

    decoders = {layout: LeanDecoder(model, layout=layout) for layout in ("in_out", "out_in")}
    best = dict.fromkeys(decoders, float("inf"))
    out: dict[str, list[int]] = {}
    for _ in range(rounds):
        for layout, dec in decoders.items():
            dec.truncate(0)
            c0 = time.process_time()
            logits = dec.forward(prefix)
            ids = []
            for _ in range(tokens):
                ids.append(int(logits[-1].argmax()))
                logits = dec.forward(ids[-1:])
            best[layout] = min(best[layout], time.process_time() - c0)
            out[layout] = ids
    rates = {k: tokens / v for k, v in best.items()}
    print(
        f"greedy decode, {len(prefix)}-token prompt + {tokens} tokens, best of {rounds} (CPU): "
        f"(in, out) {rates['in_out']:.1f} tok/s, (out, in) {rates['out_in']:.1f} tok/s, "
        f"ratio {rates['in_out'] / rates['out_in']:.2f}; same tokens: {out['in_out'] == out['out_in']}; "
        f"peak RSS {peak_rss_mb():.0f} MB"
    )


# -- load test ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def client_run(url: str, clients: int, requests: int, max_tokens: int):
    import httpx

    from posttrain.evaluate import eval_tasks

    tasks = [t for d, lvl in DOMAINS.items() for t in eval_tasks(d, lvl, 20)]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    results: list[tuple[str, float, float, int]] = []
    errors: list[str] = []

    async def one(client: httpx.AsyncClient, i: int) -> None:
        task = tasks[i % len(tasks)]
        tier = "fast" if i % 2 else "standard"
        body = {
            "model": "posttrain",
            "service_tier": tier,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": m.role, "content": m.content} for m in task.prompt],
        }
        t0 = time.perf_counter()
        ttft, tokens, served = None, 0, tier
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                errors.append(f"HTTP {resp.status_code}")
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                data = json.loads(line[6:])
                if "error" in data:
                    errors.append(data["error"]["message"])
                    return
                if ttft is None and data.get("choices"):
                    ttft = time.perf_counter() - t0
                served = data.get("service_tier", served)
                if data.get("usage"):
                    tokens = data["usage"]["completion_tokens"]
        results.append((served, time.perf_counter() - t0, ttft if ttft is not None else float("nan"), tokens))

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            try:
                await one(client, i)
            except Exception as exc:  # noqa: BLE001 - every failure is counted
                errors.append(f"{type(exc).__name__}: {exc}")

    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=clients)) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(clients)))
        wall = time.perf_counter() - t0
    return results, errors, wall


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def load_test(args: argparse.Namespace) -> None:
    import httpx

    model_dir = args.model
    if not model_dir:
        from posttrain.model.arch import random_model

        model_dir = tempfile.mkdtemp(prefix="serve-bench-")
        model, tok = random_model(args.preset, seed=0)
        model.save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "posttrain.cli",
        "serve",
        "--model",
        model_dir,
        "--port",
        str(port),
        "--set",
        "canary.probe_domains=[]",
        *[x for kv in args.serve_set for x in ("--set", kv)],
    ]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.time() > deadline:
                raise SystemExit(f"server did not start: {server.stderr.read().decode()[-2000:]}")
            time.sleep(0.3)
        results, errors, wall = asyncio.run(client_run(url, args.clients, args.requests, args.max_tokens))
        metrics = httpx.get(url + "/metrics").text
        server_rss = _vm_hwm_mb(server.pid)
    finally:
        server.terminate()
        server.wait(timeout=30)
    lat = [r[1] for r in results]
    ttft = [r[2] for r in results]
    toks = sum(r[3] for r in results)
    print(
        f"load: model {args.model or 'random ' + args.preset}; server in a separate process on loopback; "
        f"{args.clients} concurrent streaming clients; {args.requests} requests (half standard, half fast); "
        f"max_tokens {args.max_tokens}"
    )
    print(f"completed {len(results)}/{args.requests}, errors {len(errors)}{': ' + errors[0] if errors else ''}")
    print(
        f"latency p50 {pct(lat, 0.5) * 1000:.0f} ms, p99 {pct(lat, 0.99) * 1000:.0f} ms; "
        f"TTFT p50 {pct(ttft, 0.5) * 1000:.0f} ms, p99 {pct(ttft, 0.99) * 1000:.0f} ms"
    )
    for tier in ("standard", "fast"):
        tl = [r[1] for r in results if r[0] == tier]
        tt = [r[2] for r in results if r[0] == tier]
        print(
            f"  served by {tier:8s} ({len(tl):3d}): latency p50 {pct(tl, 0.5) * 1000:.0f} ms p99 "
            f"{pct(tl, 0.99) * 1000:.0f} ms; "
            f"TTFT p50 {pct(tt, 0.5) * 1000:.0f} ms p99 {pct(tt, 0.99) * 1000:.0f} ms"
        )
    sizes = [
        ln
        for ln in metrics.splitlines()
        if ln.startswith(("posttrain_batch_size_sum", "posttrain_batch_size_count", "posttrain_fast_overflows_total{"))
    ]
    print(f"throughput {toks / wall:.0f} output tokens/s over {wall:.1f} s; {'; '.join(sizes)}")
    print(f"peak RSS: server {server_rss:.0f} MB, client process {peak_rss_mb():.0f} MB")
    if errors:
        raise SystemExit(1)


def _vm_hwm_mb(pid: int) -> float:
    """A live process's peak resident set (VmHWM), MB; nan where /proc does not say."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("speed", "load", "costs"):
        s = sub.add_parser(name)
        s.add_argument("--model", help="model directory (default: random weights of --preset)")
        s.add_argument("--preset", default="medium")
        s.add_argument("--max-tokens", type=int, default=64)
        s.add_argument("--domains", help="domain:level,... (default: add:2,sub:2,mul:2,reverse:3,sort:3)")
    sp = sub.choices["speed"]
    sp.add_argument("--label")
    sp.add_argument("--per-domain", type=int, default=4)
    sp.add_argument("--rounds", type=int, default=2)
    sp.add_argument("--gate-tasks", type=int, default=0, help="held-out tasks per domain for the int8 eval delta")
    sp.add_argument("--batched", action="store_true")
    sp.add_argument("--modes", help="comma-separated indices of the fast modes to run (default: all)")
    sp.add_argument("--json")
    sp.add_argument("--warm", action="store_true", help="one untimed pass of every prompt first (repeated prompts)")
    lp = sub.choices["load"]
    lp.add_argument("--clients", type=int, default=32)
    lp.add_argument("--requests", type=int, default=256)
    lp.add_argument("--serve-set", action="append", default=[], help="a `posttrain serve --set` override")
    cp = sub.choices["costs"]
    cp.add_argument("--context", type=int, default=300, help="cached positions before the timed forward (300)")
    cp.add_argument("--reps", type=int, default=5)
    cp.add_argument("--decode", type=int, default=0, help="then greedy-decode this many tokens with both layouts")
    cp.add_argument("--target", type=float, default=2.5, help="the speed-up whose accepted length to print (2.5)")
    cp.add_argument("--rows", type=int, default=0, help="then the bound at this batch on the transformers module")
    cp.add_argument("--rows-target", type=float, default=1.8, help="the speed-up asked of rollouts at --rows (1.8)")
    args = p.parse_args()
    set_domains(args.domains)
    {"speed": speed, "load": load_test, "costs": costs}[args.cmd](args)


if __name__ == "__main__":
    main()
