"""`posttrain base build`: build (or rebuild) the embedded base model."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("base", help="the embedded base model")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    b = verbs.add_parser("build", help="pretrain the tiny embedded base model (deterministic from its seed)")
    b.add_argument("config", nargs="?", help="YAML config; its `base` section is used")
    b.add_argument("overrides", nargs="*", help="dotted overrides, e.g. base.steps=500")
    b.add_argument("--out", metavar="DIR", help="where to save it (default: the cache directory)")
    b.add_argument("--force", action="store_true", help="rebuild even if the cached model exists")
    b.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from posttrain.configs import load_config, split_cli_args
    from posttrain.model.pretrain import build_base, default_dir

    config, overrides = split_cli_args(args.config, args.overrides)
    cfg = load_config(config, overrides).base
    out = args.out or default_dir(cfg)
    if (os.path.isfile(os.path.join(out, "config.json"))) and not args.force:
        print(f"base model already built: {out}")
        return 0
    print(f"base model built: {build_base(cfg, out)}")
    return 0
