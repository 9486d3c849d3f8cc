"""`posttrain train [CONFIG] [dotted.overrides ...] [--resume RUN_DIR]`."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="post-train a model with RL and report held-out gains per domain")
    p.add_argument("config", nargs="?", help="YAML config (sparse: only what differs from defaults)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.lr=3e-4 run.steps=10")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posttrain.configs import load_config, split_cli_args

    config, overrides = split_cli_args(args.config, args.overrides)
    if args.resume and (config or overrides):
        from posttrain.errors import ConfigError

        raise ConfigError("--resume continues a run with its own config.yaml; give no config or overrides with it")
    cfg = load_config(config, overrides)
    if cfg.model.path and not args.resume:  # a wrong model path is said before the heavy imports
        from posttrain.model.arch import check_model_dir

        check_model_dir(cfg.model.path)
    from posttrain.loop import train

    result = train(cfg, resume=args.resume)
    if result is not None:  # None on torchrun ranks > 0, which only follow rank 0's trainer
        print(f"run directory: {result.run_dir}")
    return 0
