"""Speculative rollouts: the hf engine's tokens/s with `engine.speculation` off and suffix, side by side.

The RL loop's rollouts: each "step" is one engine call of the same prompts (the demo's four
domains at --difficulty, or --domains), run --rounds times as epochs would (sampled: new seeds
each round; the drafter also reads the earlier rounds' completions of the same prompt). Four
scenarios: greedy and sampled (--temperature, default 1), at batch 1 (one request of one sample
per call) and at the RL batch (--prompts prompts x --group samples in one call). One engine per
mode over the one model in this process (--modes; default: speculation off, suffix with auto-off,
the setting's default, and suffix without it, "suffix-always"; "head" and "head-always" draft with
the co-trained draft head of a model folder that holds one); within each round the modes take
turns (the order rotating), so a busy machine slows all alike. Printed per row: generated tokens/s
(best round after the first, whose warm-up is left out of every mode), the ratio to off,
forwards, mean accepted length (tokens emitted per verified draft), acceptance in all and at
depths 1-4, whether the completions were identical to off's, and the peak RSS of a child process
that runs every scenario once in that mode alone.

.venv/bin/python bench/spec_rollouts.py                                  # the cached demo base
.venv/bin/python bench/spec_rollouts.py --model runs/x/checkpoints/step_00000100   # a trained policy
.venv/bin/python bench/spec_rollouts.py --model EXPORT --domains pyfunc_revise:1,ifeval:1 --prompts 8 --group 4 \
    --max-tokens 128 --temperature 0.7 --modes off,suffix-always,head-always      # the real model after RL
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
MODES = {
    "off": ("off", True),
    "suffix": ("suffix", True),
    "suffix-always": ("suffix", False),
    "head": ("head", True),
    "head-always": ("head", False),
    "head-all-always": ("head", False),
}
"""Mode name -> (engine.speculation.kind, auto_off; "-always": without auto-off). The head modes
need a model folder with the co-trained draft head (`draft_head.pt`: a checkpoint or export of a
run with trainer.draft_head); "head-all-always" drafts with the same head over the whole
vocabulary instead of its draft vocabulary (trainer.draft_head.vocab)."""


def setup(args: argparse.Namespace, modes: list[str]):
    """The model, one engine per mode, and the prompts."""
    import torch

    from posttrain.configs import load_config
    from posttrain.configs.engine import SpeculationConfig
    from posttrain.engine.hf import HFEngine, HFEngineConfig
    from posttrain.evaluate import eval_tasks
    from posttrain.model.arch import load_model
    from posttrain.model.draft_head import DraftHead, load_if_any
    from posttrain.model.pretrain import ensure_base

    torch.set_num_threads(1)
    path = args.model or ensure_base(load_config(ROOT / "configs" / "default.yaml").base, progress=False)
    model, tok = load_model(path, device="cpu")
    model.eval()
    wants_head = any(MODES[m][0] == "head" for m in modes)
    head = load_if_any(path, model) if wants_head else None
    if head is None and wants_head:
        raise SystemExit(
            f"{path}: no draft head (draft_head.pt) for the head modes; train with trainer.draft_head.enabled"
        )
    engines = {}
    for m in modes:
        kind, auto = MODES[m]
        spec = SpeculationConfig(kind=kind, max_draft=args.max_draft, auto_off=auto)
        drafter = head
        if m == "head-all-always" and head is not None:  # the same weights, no draft vocabulary
            drafter = DraftHead(head.hidden, head.depth, head.eps, vocab_top=0)
            drafter.load_state_dict(head.state_dict())
            drafter.eval()
        engines[m] = HFEngine(model, tok, config=HFEngineConfig(speculation=spec), seed=0, draft_head=drafter)
    levels = domain_levels(args)
    per_domain = [eval_tasks(d, lvl, args.prompts) for d, lvl in levels.items()]
    tasks = [t for round_robin in zip(*per_domain) for t in round_robin][: args.prompts]
    prompts = [engines[modes[0]].encode_chat(t.prompt) for t in tasks]
    return engines, prompts


def domain_levels(args: argparse.Namespace) -> dict[str, int]:
    """--domains add:1,sort:2 (each domain at its level), else the demo's four at --difficulty."""
    if not args.domains:
        return {d: args.difficulty for d in DOMAINS}
    from common import domain_levels as parse  # bench/common.py: this script runs with bench/ first on sys.path

    return parse(args.domains)


def step(engine, prompts, scenario: str, r: int, args: argparse.Namespace) -> tuple[float, int, list]:
    """One step of a scenario: (seconds, generated tokens, the completions' token ids)."""
    from posttrain.types import GenerationRequest, SamplingParams

    temperature = 0.0 if scenario.startswith("greedy") else args.temperature
    group = args.group if scenario.endswith("rl") else 1
    reqs = [
        GenerationRequest(p, SamplingParams(n=group, max_tokens=args.max_tokens, temperature=temperature, seed=seed))
        for seed, p in enumerate(prompts, start=r * 100_003)
    ]
    calls = [reqs] if group > 1 else [[q] for q in reqs]  # batch 1: one request of one sample per call
    before = engine.stats().generated_tokens
    start = time.perf_counter()
    outs = [list(c.token_ids) for call in calls for g in engine.generate(call) for c in g]
    return time.perf_counter() - start, engine.stats().generated_tokens - before, outs


def rss_child(args: argparse.Namespace) -> None:
    """Every scenario once in one mode (--rss-of), alone in this process; prints the peak RSS."""
    engines, prompts = setup(args, [args.rss_of])
    for scenario in args.scenarios.split(","):
        step(engines[args.rss_of], prompts, scenario, 0, args)
    print(json.dumps({"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def peak_rss(args: argparse.Namespace, mode: str) -> float:
    passed = [
        "model",
        "prompts",
        "group",
        "max_tokens",
        "max_draft",
        "difficulty",
        "scenarios",
        "domains",
        "temperature",
    ]
    cmd = [sys.executable, __file__, "--rss-of", mode]
    cmd += [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in passed if getattr(args, k) is not None]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode:
        raise SystemExit(f"peak RSS of {mode} failed:\n{out.stderr[-3000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mb"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a model directory (a trained checkpoint); default: the demo's cached base")
    ap.add_argument("--prompts", type=int, default=32, help="prompts per step (the demo's prompts_per_step)")
    ap.add_argument("--group", type=int, default=8, help="samples per prompt at the RL batch (group_size)")
    ap.add_argument("--rounds", type=int, default=4, help="steps over the same prompts (epochs)")
    ap.add_argument("--difficulty", type=int, default=1, help="the domains' level (1: the demo's)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-draft", type=int, default=8)
    ap.add_argument("--scenarios", default="greedy-1,sampled-1,greedy-rl,sampled-rl")
    ap.add_argument("--domains", help="domain:level,... (default: the demo's add, sub, reverse, sort at --difficulty)")
    ap.add_argument("--temperature", type=float, default=1.0, help="the sampled scenarios' temperature")
    ap.add_argument(
        "--modes", default="off,suffix,suffix-always", help=f"comma separated, 'off' first: {', '.join(MODES)}"
    )
    ap.add_argument("--no-rss", action="store_true", help="skip the per-mode peak RSS child processes")
    ap.add_argument("--rss-of", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_of:
        rss_child(args)
        return
    from posttrain.engine.speculate import acceptance_row

    started = time.perf_counter()
    modes = args.modes.split(",")
    if modes[0] != "off" or not set(modes) <= set(MODES) or len(set(modes)) != len(modes):
        raise SystemExit(f"--modes {args.modes!r}: 'off' first, then any of {', '.join(list(MODES)[1:])}, once each")
    engines, prompts = setup(args, modes)
    print(
        f"model: {args.model or 'the demo base (configs/default.yaml)'}; {len(prompts)} prompts of "
        f"{domain_levels(args)}, group {args.group}, T {args.temperature} sampled, {args.rounds} rounds, "
        f"max_tokens {args.max_tokens}, max_draft {args.max_draft}, one torch thread"
    )
    rss = {m: float("nan") if args.no_rss else peak_rss(args, m) for m in modes}
    cols = (
        "scenario",
        "mode",
        "tokens/s",
        "ratio",
        "forwards",
        "mean accepted len",
        "acceptance",
        "d1 / d2 / d3 / d4",
        "identical",
        "RSS MB",
    )
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for scenario in args.scenarios.split(","):
        best = {m: 0.0 for m in modes}
        forwards = {m: 0 for m in modes}
        counts0 = {m: engines[m].counters() for m in modes}
        same = {m: True for m in modes}
        for r in range(args.rounds):
            outs = {}
            for m in modes[r % len(modes) :] + modes[: r % len(modes)]:
                f0 = engines[m].stats().forward_calls
                secs, tokens, outs[m] = step(engines[m], prompts, scenario, r, args)
                forwards[m] += engines[m].stats().forward_calls - f0
                if r or args.rounds == 1:
                    best[m] = max(best[m], tokens / secs)
            for m in modes:
                same[m] &= outs[m] == outs["off"]
        for m in modes:
            fig = acceptance_row(engines[m].counters(), counts0[m])  # the metrics row's figures, the one home
            acc_len = f"{fig['spec_accepted_len']:.2f}" if "spec_accepted_len" in fig else ""
            acceptance = f"{fig['spec_acceptance']:.2f}" if "spec_acceptance" in fig else ""
            at = [fig.get(f"spec_acceptance_d{d}") for d in range(1, 5)]
            depths = " / ".join("-" if a is None else f"{a:.2f}" for a in at) if acceptance else ""
            print(
                f"| {scenario} | {m} | {best[m]:.0f} | {best[m] / best['off']:.2f} | {forwards[m]} | {acc_len} | "
                f"{acceptance} | {depths} | {'yes' if same[m] else 'NO'} | {rss[m]:.0f} |",
                flush=True,
            )
    print(f"wall {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
