"""The push probe's cost beside a rollout step (issue 38 item 4; docs/engines.md, "Collapse check").

On a model folder holding a draft head (a checkpoint or `posttrain export` of a run with
trainer.draft_head; a LoRA checkpoint needs exporting first), an hf engine drafting with the head
as `posttrain train` runs it (engine.speculation.kind head, auto-off on) generates one RL step of
rollouts (--prompts prompts of --domains, --group samples each at --temperature, up to
--max-tokens; timed: the reference). Then, for each probe setting, a fresh engine starting from the
prompts that step showed the first one runs the push probe as `WeightSync.push` runs it after every
push (`HFEngine.spec_probe`): the shipped setting (PROBE_TOKENS tokens a prompt; its first call
keeps the fewest prompts that give about PROBE_ROW_STEPS drafting row-steps), the same over every
prompt seen (at most PROBE_PROMPTS: the probe before the trim), and each --variants TOKENS:ROW_STEPS.
The first call is printed apart (it measures twice when it trims); the next --repeats calls are
timed and their median printed. One torch thread. Printed per setting: seconds (wall and CPU), the
ratio to the rollout step, prompts kept, drafting row-steps, tokens per drafting step; and the
process's peak RSS.

.venv/bin/python bench/spec_probe.py --model EXPORT --prompts 16 --variants 16:96 16:64   # the real model
.venv/bin/python bench/spec_probe.py --model runs/x/checkpoints/step_00000300 --domains add:1,sub:1 \
    --max-tokens 32 --prompts 32 --group 8 --temperature 1                               # the embedded demo
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def timed(fn):  # type: ignore[no-untyped-def]
    """(wall s, CPU s, fn's result)."""
    wall, cpu = time.perf_counter(), time.process_time()
    got = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a model folder with draft_head.pt")
    ap.add_argument("--domains", default="pyfunc_revise:1,ifeval:1", help="domain:level,... (the rollouts' tasks)")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step (configs/real.yaml: 8)")
    ap.add_argument("--group", type=int, default=4, help="samples per prompt (configs/real.yaml: 4)")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3, help="probe calls timed after the first")
    ap.add_argument("--variants", nargs="*", default=[], help="more probes to time, each TOKENS:ROW_STEPS (e.g. 16:96)")
    args = ap.parse_args()

    import torch
    from common import domain_levels

    import posttrain.engine.hf as hf
    from posttrain.configs.engine import SpeculationConfig
    from posttrain.engine.hf import HFEngine, HFEngineConfig
    from posttrain.evaluate import eval_tasks
    from posttrain.model.arch import load_model
    from posttrain.model.draft_head import load_if_any
    from posttrain.types import GenerationRequest, SamplingParams

    torch.set_num_threads(1)
    model, tok = load_model(args.model, device="cpu")
    model.eval()
    head = load_if_any(args.model, model)
    if head is None:
        raise SystemExit(f"{args.model}: no draft head (draft_head.pt); train with trainer.draft_head.enabled")
    spec = SpeculationConfig(kind="head")
    per_domain = [eval_tasks(d, lvl, args.prompts) for d, lvl in domain_levels(args.domains).items()]
    tasks = [t for round_robin in zip(*per_domain) for t in round_robin][: args.prompts]
    print(f"{args.model}: {len(tasks)} prompts x {args.group} samples, T {args.temperature}, {args.max_tokens} tokens")
    first = HFEngine(model, tok, config=HFEngineConfig(speculation=spec), seed=0, draft_head=head)
    reqs = [
        GenerationRequest(
            first.encode_chat(t.prompt),
            SamplingParams(n=args.group, max_tokens=args.max_tokens, temperature=args.temperature, seed=i),
        )
        for i, t in enumerate(tasks)
    ]
    step_s, step_cpu, _ = timed(lambda: first.generate(reqs))
    seen = list(first._probe_prompts)  # what the probe of an engine after this step starts from
    print(f"rollout step: {step_s:.2f} s wall, {step_cpu:.2f} s CPU; the probe's prompts seen: {len(seen)}")
    print(
        "| probe (tokens, row-steps aimed at) | first probe s | probe s (median of next) wall / CPU "
        "| ratio to the step (wall) | prompts | drafting row-steps | tokens per drafting step |"
    )
    print("|---|---:|---|---:|---:|---:|---:|")
    shipped = (hf.PROBE_TOKENS, hf.PROBE_ROW_STEPS)
    variants = [shipped, (shipped[0], 1 << 30)] + [tuple(int(x) for x in v.split(":")) for v in args.variants]
    for tokens, row_steps in variants:
        hf.PROBE_TOKENS, hf.PROBE_ROW_STEPS = tokens, row_steps
        eng = HFEngine(model, tok, config=HFEngineConfig(speculation=spec), seed=0, draft_head=head)
        eng._probe_prompts = list(seen)
        first_s, _, got = timed(eng.spec_probe)
        runs = [timed(eng.spec_probe) for _ in range(args.repeats)]
        wall, cpu = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
        got = runs[-1][2] if runs else got
        name = f"{tokens}, {'all prompts' if row_steps == 1 << 30 else row_steps}"
        name += " (shipped)" if (tokens, row_steps) == shipped else ""
        print(
            f"| {name} | {first_s:.2f} | {wall:.2f} / {cpu:.2f} | {wall / step_s:.3f} "
            f"| {len(eng._probe_prompts)} | {got.get('spec_drafting', 0)} | {got.get('spec_step_len', '-')} |"
        )
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
