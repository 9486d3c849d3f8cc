"""vLLM paging on its CPU build: the same batch against a tiny KV pool and a roomy one, side by side.

For each pool (--pools: block counts for `--num-gpu-blocks-override`, `default` for vLLM's own pool
of engine.vllm.cpu_kv_cache_gib = 1 GiB) one server is started the way the vllm engine starts it
(`VLLMServer`, --max-model-len --max-len) on the embedded base's architecture (preset tiny, pretrained
60 steps, as the vllm lane's tests), and sent one batch at once: --requests prompts of --prompt-len
ordinary token ids, --max-tokens each with `ignore_eos` (every request holds prompt + max-tokens
tokens at its end), even requests greedy, odd ones sampled at T = 1 with their own seeds. Measured:
  - pool tokens (the server log's "KV cache size"; one block of it is vLLM's null block, the
    rest holds sequences) and the tokens the batch holds together at its end (requests x
    (prompt + max tokens)), over the pool's usable tokens;
  - preemptions (`vllm:num_preemptions_total` over the batch);
  - wall seconds of the batch and completion tokens/s, and the tiny pool's wall over the roomy one's;
  - peak RSS of the server's process tree (sampled every 0.2 s from its start; the sum of each
    process's VmHWM beside it, an upper bound);
  - whether every request's tokens and log-probs equal the first pool's.

    .venv/bin/python bench/vllm_paging.py                       # pools 5 and default
    .venv/bin/python bench/vllm_paging.py --pools 5 9 default

Needs .venv-vllm (`make vllm-venv`). Prints a markdown table; --out writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engines import TreeRSS  # noqa: E402

BLOCK_TOKENS = 128
"""Tokens per KV block of vLLM's CPU build."""


def bodies(args: argparse.Namespace) -> list[dict[str, Any]]:
    from posttrain.engine.openai import completion_body
    from posttrain.engine.vllm import BASE_NAME
    from posttrain.types import GenerationRequest, SamplingParams

    rng = random.Random(0)
    out = []
    for i in range(args.requests):
        prompt = tuple(rng.randrange(4, 100) for _ in range(args.prompt_len))
        params = SamplingParams(max_tokens=args.max_tokens, temperature=float(i % 2), seed=100 + i)
        out.append({**completion_body(BASE_NAME, GenerationRequest(prompt, params)), "ignore_eos": True})
    return out


def one_pool(base: str, pool: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from posttrain.configs.engine import VLLMConfig
    from posttrain.engine.vllm import VLLMServer

    extra = ("--max-num-seqs", str(args.requests))
    extra += ("--num-gpu-blocks-override", pool) if pool != "default" else ()
    server = VLLMServer(base, work / f"pool-{pool}", VLLMConfig(max_model_len=args.max_len, extra_args=extra))
    server.start()
    assert server.proc is not None
    rss = TreeRSS(server.proc.pid)
    try:
        batch = bodies(args)
        before = server.metric("vllm:num_preemptions_total")
        with server.client(1800.0, len(batch) + 2) as c:

            def send(body: dict[str, Any]) -> tuple[list[int], list[float]]:
                choice = c.post(server.url + "/v1/completions", json=body).raise_for_status().json()["choices"][0]
                return choice["token_ids"], choice["logprobs"]["token_logprobs"]

            t0 = time.perf_counter()
            with ThreadPoolExecutor(len(batch)) as ex:
                outs = list(ex.map(send, batch))
            wall = time.perf_counter() - t0
        preempted = server.metric("vllm:num_preemptions_total") - before
        pool_tokens = server.kv_cache_tokens() or 0
    finally:
        mem = rss.stop()
        server.stop()
    return {
        "pool": pool,
        "pool_tokens": pool_tokens,
        "held_at_end": args.requests * (args.prompt_len + args.max_tokens),
        "preemptions": preempted,
        "wall_s": wall,
        "tokens_per_s": sum(len(ids) for ids, _ in outs) / wall,
        "completed": sum(len(ids) == args.max_tokens for ids, _ in outs),
        "outputs": outs,
        **mem,
    }


def table(rows: list[dict[str, Any]]) -> str:
    ref = rows[0]
    head = "| pool (blocks) | pool tokens | held at end | held / usable pool | preemptions | completed |"
    head += " wall s | tokens/s | wall / last pool's | peak RSS MiB (sum of VmHWM) | outputs = first pool's |"
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        same = all(
            a[0] == b[0] and max((abs(x - y) for x, y in zip(a[1], b[1])), default=0.0) <= 1e-4
            for a, b in zip(r["outputs"], ref["outputs"])
        )
        lines.append(
            f"| {r['pool']} | {r['pool_tokens']:,} | {r['held_at_end']:,} | "
            f"{r['held_at_end'] / (r['pool_tokens'] - BLOCK_TOKENS):.2f} | {r['preemptions']:.0f} | "
            f"{r['completed']}/{len(r['outputs'])} | "
            f"{r['wall_s']:.1f} | {r['tokens_per_s']:.0f} | {r['wall_s'] / rows[-1]['wall_s']:.2f}x | "
            f"{r['peak_rss_mb']:.0f} ({r['sum_vm_hwm_mb']:.0f}) | {'yes' if same else 'NO'} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pools", nargs="+", default=["5", "default"])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=320)
    ap.add_argument("--max-len", type=int, default=512)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    from posttrain.configs.base import BaseConfig
    from posttrain.model.pretrain import build_base

    with tempfile.TemporaryDirectory(prefix="vllm-paging-") as tmp:
        work = Path(tmp)
        base = work / "tiny"
        build_base(BaseConfig(preset="tiny", steps=60, batch_size=16, threads=1), base, progress=False)
        rows = [one_pool(str(base), pool, args, work) for pool in args.pools]
    print(table(rows))
    if args.out:
        args.out.write_text(json.dumps([{k: v for k, v in r.items() if k != "outputs"} for r in rows], indent=1))


if __name__ == "__main__":
    main()
