"""SFT then RL against RL alone at equal CPU, on a domain the embedded base cannot yet format.

The domain (default rg_family_relationships at level 1: "Noah is married to Eleanor. They have a
child called Ryder.\n\nHow is Eleanor related to Ryder? ...", the answer one of husband, wife,
father, mother, son inside <answer></answer>; 100 distinct held-out items) is one the demo base
never saw (it learned add, sub, reverse and sort): it scores 0 held-out, greedy and in 8 samples,
so RL alone gets no reward to learn from. Per seed, from the same cached base (configs/default.yaml's):

  rl    `posttrain train` on the domain with run.cpu_budget_s=BUDGET;
  sft   `posttrain sft` on demonstrations written from the domain's own train-split gold
        answers (scripts/sft_demos.py), then `posttrain train` from its final checkpoint with
        run.cpu_budget_s=BUDGET minus the CPU seconds the fine-tuning spent.

Both arms are measured on the same held-out set (eval.seed, the train run's RunEvaluator) before
and after; CPU is this process's CPU time in the training steps (the clock of run.cpu_budget_s;
evaluations, loading and the demonstrations' writing are outside both arms alike). Prints per
seed the held-out accuracy of the base, after SFT, and at the end of each arm, the CPU each spent,
then the median gain of each arm over the base with its spread, what an RL step of each arm cost
(CPU-s per step, split by whether it trained; completion tokens per rollout; the mean reward,
all from the run's metrics.jsonl), and the peak RSS.

    .venv/bin/python bench/sft.py --seeds 0 1 2 --budget 100
    .venv/bin/python bench/sft.py --summarize s0.json s1.json s2.json   # seeds run one per process

The peak RSS line is this process's (in --summarize: the summariser's, not the runs').
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def _train_overrides(domain: str, max_tokens: int, out: str, name: str, seed: int, budget: float) -> list[str]:
    return [
        f"tasks.domains={{{domain}: {{difficulty: 1, max_tokens: {max_tokens}}}}}",
        f"run.seed={seed}",
        f"run.out_dir={out}",
        f"run.name={name}",
        f"run.cpu_budget_s={budget}",
        "run.steps=100000",
        "run.checkpoint_every=0",
        "run.progress=false",
        "eval.tasks_per_domain=100",
        "eval.every_steps=0",
        "eval.samples=0",
        "eval.above_tasks=0",
        "eval.contamination=false",
        "eval.exposure=false",
        "monitor.report=false",
    ]


def _rl(config: Path, overrides: list[str], model_path: str | None) -> dict:
    from posttrain.configs import load_config
    from posttrain.loop import train
    from posttrain.trainer.checkpoint import latest_checkpoint

    extra = [f"model.path={model_path}"] if model_path else []
    result = train(load_config(config, [*overrides, *extra]), log=lambda *_: None)
    assert result is not None
    state = json.loads((latest_checkpoint(result.run_dir) / "loop_state.json").read_text())
    return {
        "before": result.before.mean_accuracy,
        "after": result.after.mean_accuracy,
        "steps": result.steps,
        "cpu_s": state["train_cpu_s"],
        **_step_costs(Path(result.run_dir) / "metrics.jsonl"),
    }


def _step_costs(metrics: Path) -> dict:
    """What an RL step cost and held, from the run's `train` rows: CPU-s per step (the difference
    of consecutive train_cpu_s), split by whether the step trained (groups_kept > 0: a group with
    mixed rewards) or only sampled; the completion tokens per rollout; the reward."""
    rows = [r for r in map(json.loads, metrics.read_text().splitlines()) if r.get("kind") == "train"]
    cpu, prev = [], 0.0
    for r in rows:
        cpu.append(r["train_cpu_s"] - prev)
        prev = r["train_cpu_s"]
    trained = [c for c, r in zip(cpu, rows) if r.get("groups_kept", 0) > 0]
    idle = [c for c, r in zip(cpu, rows) if r.get("groups_kept", 0) == 0]
    tokens = [v for r in rows for k, v in r.items() if k.startswith("tokens_mean_")]

    def mean(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    return {
        "cpu_per_step": mean(cpu),
        "steps_trained": len(trained),
        "cpu_per_trained_step": mean(trained),
        "cpu_per_untrained_step": mean(idle),
        "completion_tokens": mean(tokens),
        "reward_mean": mean([r["reward_mean"] for r in rows]),
    }


def one_seed(seed: int, args: argparse.Namespace, demos: str, out: str) -> dict:
    from posttrain.configs import load_config
    from posttrain.sft.run import sft

    base = _train_overrides(args.domain, args.max_tokens, out, f"rl-{seed}", seed, args.budget)
    rl = _rl(args.config, base, None)
    sft_cfg = load_config(
        ROOT / "configs" / "sft.yaml",
        [
            f"sft.data={demos}",
            f"sft.epochs={args.epochs}",
            f"sft.lr={args.lr}",
            f"sft.batch_tokens={args.batch_tokens}",
            "sft.evaluate=false",
            f"tasks.domains={{{args.domain}: {{difficulty: 1, max_tokens: {args.max_tokens}}}}}",
            f"run.seed={seed}",
            f"run.out_dir={out}",
            f"run.name=sft-{seed}",
            "run.progress=false",
        ],
    )
    tuned = sft(sft_cfg, log=lambda *_: None)
    left = max(args.budget - tuned.cpu_s, 1.0)
    then = _train_overrides(args.domain, args.max_tokens, out, f"sft-rl-{seed}", seed, left)
    after_sft = _rl(args.config, then, str(tuned.checkpoint))
    return {
        "seed": seed,
        "budget": args.budget,
        "rl": rl,
        "sft_cpu_s": tuned.cpu_s,
        "sft_steps": tuned.steps,
        "sft_rl": after_sft,
        "peak_rss_mib": _peak_mib(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--budget", type=float, default=100.0, help="CPU seconds of training per arm (SFT counted)")
    p.add_argument("--domain", default="rg_family_relationships")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--demos", type=int, default=1000, help="demonstrations written from train-split gold answers")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--batch-tokens", type=int, default=1024)
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    p.add_argument("--json", help="also write the per-seed results here")
    p.add_argument("--summarize", nargs="+", metavar="JSON", help="only summarise the --json files of earlier runs")
    args = p.parse_args(argv)
    if args.summarize:
        rows = [row for path in args.summarize for row in json.loads(Path(path).read_text())]
        _summary(sorted(rows, key=lambda r: r["seed"]), args)
        return 0
    import sft_demos

    rows = []
    with tempfile.TemporaryDirectory() as out:
        demos = os.path.join(out, "demos.jsonl")
        sft_demos.write(sft_demos.demos(args.domain, 1, args.demos), demos)
        for seed in args.seeds:
            row = one_seed(seed, args, demos, out)
            rows.append(row)
            rl, sr = row["rl"], row["sft_rl"]
            print(
                f"seed {seed}: base {rl['before']:.3f} | rl alone -> {rl['after']:.3f} ({rl['steps']} steps, "
                f"{rl['cpu_s']:.1f} CPU-s) | sft -> {sr['before']:.3f} ({row['sft_steps']} steps, "
                f"{row['sft_cpu_s']:.1f} CPU-s) then rl -> {sr['after']:.3f} ({sr['steps']} steps, "
                f"{sr['cpu_s']:.1f} CPU-s; total {row['sft_cpu_s'] + sr['cpu_s']:.1f})",
                flush=True,
            )
            for arm in ("rl", "sft_rl"):
                print(f"  {arm} steps: {_costs(row[arm])}", flush=True)
    _summary(rows, args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


def _summary(rows: list[dict], args: argparse.Namespace) -> None:
    def spread(values: list[float]) -> str:
        return f"median {statistics.median(values):+.3f} [min {min(values):+.3f}, max {max(values):+.3f}]"

    rl = [r["rl"]["after"] - r["rl"]["before"] for r in rows]
    sft_only = [r["sft_rl"]["before"] - r["rl"]["before"] for r in rows]
    sft_rl = [r["sft_rl"]["after"] - r["rl"]["before"] for r in rows]
    ahead = sum(a > b for a, b in zip(sft_rl, rl))
    budgets = sorted({r.get("budget", args.budget) for r in rows})
    print(f"{args.domain} level 1, budget {'/'.join(f'{b:g}' for b in budgets)} CPU-s per arm, {len(rows)} seeds:")
    print(f"  gain over the base, rl alone:  {spread(rl)}")
    print(f"  gain over the base, sft only:  {spread(sft_only)}")
    print(f"  gain over the base, sft -> rl: {spread(sft_rl)}")
    print(f"  sft -> rl ahead of rl alone in {ahead}/{len(rows)} seeds")
    for r in rows:
        if "cpu_per_step" in r["rl"]:
            print(f"  seed {r['seed']} rl alone: {_costs(r['rl'])}")
            print(f"  seed {r['seed']} sft -> rl: {_costs(r['sft_rl'])}")
    if args.summarize:
        peaks = [r["peak_rss_mib"] for r in rows if "peak_rss_mib" in r]
        print(f"  peak RSS of the runs: {max(peaks):.0f} MiB" if peaks else "  peak RSS: not recorded")
    else:
        print(f"  peak RSS {_peak_mib():.0f} MiB")


def _costs(arm: dict) -> str:
    def f(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    return (
        f"{f(arm['cpu_per_step'], '.3f')} CPU-s/step; {arm['steps_trained']}/{arm['steps']} trained at "
        f"{f(arm['cpu_per_trained_step'], '.3f')}, the rest at {f(arm['cpu_per_untrained_step'], '.3f')}; "
        f"{f(arm['completion_tokens'], '.1f')} completion tokens/rollout; reward {f(arm['reward_mean'], '.3f')}"
    )


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    sys.exit(main())
