"""`posttrain train [CONFIG] [dotted.overrides ...] [--resume RUN_DIR | --from CHECKPOINT]`."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="post-train a model with RL and report held-out gains per domain")
    p.add_argument("config", nargs="?", help="YAML config (sparse: only what differs from defaults)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.lr=3e-4 run.steps=10")
    start = p.add_mutually_exclusive_group()
    start.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a run from its newest intact checkpoint; overrides (or CONFIG) may change only the "
        "fields a resume keeps the same run with (run.steps to extend it, trainer.lr, eval.every_steps, ...; "
        "the others are refused by name: docs/reliability.md)",
    )
    start.add_argument(
        "--from",
        dest="source",
        metavar="CHECKPOINT",
        help="start a new run (step 0, fresh optimizer) from the weights of another run's checkpoint "
        "(RUN/checkpoints/step_N, or RUN for its newest); without CONFIG it takes that run's config",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posttrain import lineage
    from posttrain.configs import load_config, split_cli_args

    config, overrides = split_cli_args(args.config, args.overrides)
    if args.resume:
        cfg = lineage.resume_overrides(args.resume, config, overrides)
    elif args.source:
        cfg = lineage.branch_config(args.source, config, overrides)
    else:
        cfg = load_config(config, overrides)
    if cfg is not None and cfg.model.path and not args.resume:  # a wrong model path is said before the heavy imports
        from posttrain.model.arch import check_model_dir

        check_model_dir(cfg.model.path)
    if args.resume and (done := lineage.finished_resume(args.resume, cfg, _verify)):  # before the loop loads
        print(done)
        return 0
    from posttrain.loop import train

    result = train(cfg, resume=args.resume)
    if result is not None:  # None on torchrun ranks > 0, which only follow rank 0's trainer
        print(f"run directory: {result.run_dir}")
    return 0


def _verify(path: Path) -> None:
    """trainer/checkpoint.py's check, imported (with torch) only when a resume needs it."""
    from posttrain.trainer.checkpoint import verify_checkpoint

    verify_checkpoint(path)
