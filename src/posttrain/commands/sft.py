"""`posttrain sft [CONFIG] [dotted.overrides ...]`: supervised fine-tuning on demonstrations."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sft",
        help="supervised fine-tuning on chat demonstrations (loss on assistant turns), evaluated held-out "
        "before and after; its checkpoint is a model.path for `posttrain train`",
    )
    p.add_argument("config", nargs="?", help="YAML config (the `sft` section, plus model/base/tasks/eval/run)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. sft.data=demos.jsonl sft.epochs=3")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posttrain.configs import load_config, split_cli_args

    config, overrides = split_cli_args(args.config, args.overrides)
    cfg = load_config(config, overrides)
    from posttrain.sft.run import sft

    result = sft(cfg)
    print(f"run directory: {result.run_dir}")
    return 0
