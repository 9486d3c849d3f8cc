"""Speculative rollouts: the hf engine's tokens/s with `engine.speculation` off and suffix, side by side.

The RL loop's rollouts: each "step" is one engine call of the same prompts (the demo's four
domains at level 1), run `--rounds` times as epochs would (sampled: a new seed per round; the
drafter also reads the earlier rounds' completions of the same prompt). Four scenarios, each
with speculation off and on, each mode in its own child process (all scenarios in turn) so
that peak RSS is each mode's own: greedy and sampled (T = 1), at batch 1 (one request of one sample per call) and at
the RL batch (--prompts prompts x --group samples in one call). Printed per row: generated
tokens/s (best round after the first, so the first call's warm-up is left out of both modes),
the ratio, mean accepted length (tokens emitted per verified draft), acceptance, whether the
completions were identical to the mode-off ones, and peak RSS.

.venv/bin/python bench/spec_rollouts.py                                  # the cached demo base
.venv/bin/python bench/spec_rollouts.py --model runs/x/checkpoints/step_00000100   # a trained policy
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOMAINS = ("add", "sub", "reverse", "sort")


def one(args: argparse.Namespace) -> dict:
    """Every scenario of one mode in this process: per scenario the per-round timings, the
    outputs, the speculation counters it added and its forwards; the process's peak RSS."""
    import torch

    from posttrain.configs import load_config
    from posttrain.configs.engine import SpeculationConfig
    from posttrain.engine.hf import HFEngine, HFEngineConfig
    from posttrain.evaluate import eval_tasks
    from posttrain.model.arch import load_model
    from posttrain.model.pretrain import ensure_base

    torch.set_num_threads(1)
    path = args.model or ensure_base(load_config(ROOT / "configs" / "default.yaml").base, progress=False)
    model, tok = load_model(path, device="cpu")
    spec = SpeculationConfig(kind=args.mode, max_draft=args.max_draft, auto_off=not args.no_auto_off)
    engine = HFEngine(model.eval(), tok, config=HFEngineConfig(speculation=spec), seed=0)
    per_domain = [eval_tasks(d, 1, args.prompts) for d in DOMAINS]
    tasks = [t for round_robin in zip(*per_domain) for t in round_robin][: args.prompts]
    prompts = [engine.encode_chat(t.prompt) for t in tasks]
    got = {}
    for scenario in args.one.split(","):
        got[scenario] = _scenario(engine, prompts, scenario, args)
    return {"scenarios": got, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _scenario(engine, prompts, scenario: str, args: argparse.Namespace) -> dict:
    from posttrain.types import GenerationRequest, SamplingParams

    temperature = 0.0 if scenario.startswith("greedy") else 1.0
    group = args.group if scenario.endswith("rl") else 1
    counts0, forwards0 = engine.counters(), engine.stats().forward_calls
    rounds, digests = [], []
    for r in range(args.rounds):
        reqs = [
            GenerationRequest(
                p, SamplingParams(n=group, max_tokens=args.max_tokens, temperature=temperature, seed=r * 100_003 + i)
            )
            for i, p in enumerate(prompts)
        ]
        calls = [reqs] if group > 1 else [[q] for q in reqs]  # batch 1: one request of one sample per call
        before = engine.stats().generated_tokens
        start = time.perf_counter()
        outs = [c for call in calls for g in engine.generate(call) for c in g]
        secs = time.perf_counter() - start
        rounds.append({"seconds": secs, "tokens": engine.stats().generated_tokens - before})
        digests.append([list(c.token_ids) for c in outs])
    counts = {k: v - counts0.get(k, 0) for k, v in engine.counters().items()}
    return {
        "rounds": rounds,
        "outputs": digests,
        "counters": counts,
        "forwards": engine.stats().forward_calls - forwards0,
    }


def child(args: argparse.Namespace, scenarios: str, mode: str) -> dict:
    cmd = [sys.executable, __file__, "--one", scenarios, "--mode", mode] + [
        f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k in PASSED and v is not None
    ]
    cmd += ["--no-auto-off"] if args.no_auto_off else []
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode:
        raise SystemExit(f"{scenarios}/{mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


PASSED = ("model", "prompts", "group", "rounds", "max_tokens", "max_draft")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a model directory (a trained checkpoint); default: the demo's cached base")
    ap.add_argument("--prompts", type=int, default=32, help="prompts per step (the demo's prompts_per_step)")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt at the RL batch (group_size)")
    ap.add_argument("--rounds", type=int, default=3, help="steps over the same prompts (epochs)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-draft", type=int, default=8)
    ap.add_argument("--no-auto-off", action="store_true", help="speculate in every bucket (no auto-off)")
    ap.add_argument("--scenarios", default="greedy-1,sampled-1,greedy-rl,sampled-rl")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="off", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args)))
        return
    print(
        f"model: {args.model or 'the demo base (configs/default.yaml)'}; {args.prompts} prompts, group {args.group}, "
        f"{args.rounds} rounds, max_tokens {args.max_tokens}, max_draft {args.max_draft}, "
        f"auto_off {'off' if args.no_auto_off else 'on'}, one torch thread"
    )
    head = (
        "| scenario | mode | tokens/s | ratio | forwards | mean accepted len | acceptance | identical | peak RSS MB |"
    )
    print(head + "\n|" + "---|" * 9)
    started = time.perf_counter()
    runs = {mode: child(args, args.scenarios, mode) for mode in ("off", "suffix")}
    rss = {mode: runs[mode]["peak_rss_mb"] for mode in runs}
    for scenario in args.scenarios.split(","):
        off, on = runs["off"]["scenarios"][scenario], runs["suffix"]["scenarios"][scenario]
        rate = {}
        for mode, res in (("off", off), ("suffix", on)):
            later = res["rounds"][1:] or res["rounds"]
            rate[mode] = max(r["tokens"] / r["seconds"] for r in later)
        same = off["outputs"] == on["outputs"]
        c = on["counters"]
        acc_len = 1 + c["spec_accepted"] / c["spec_rows"] if c.get("spec_rows") else float("nan")
        acceptance = c["spec_accepted"] / c["spec_proposed"] if c.get("spec_proposed") else float("nan")
        print(
            f"| {scenario} | off | {rate['off']:.0f} | 1.00 | {off['forwards']} | | | | {rss['off']:.0f} |\n"
            f"| {scenario} | suffix | {rate['suffix']:.0f} | {rate['suffix'] / rate['off']:.2f} | {on['forwards']} | "
            f"{acc_len:.2f} | {acceptance:.2f} | {'yes' if same else 'NO'} | {rss['suffix']:.0f} |",
            flush=True,
        )
    print(f"wall {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
