"""The `posttrain` console script: one parser, one module per subcommand.

Invariant: importing this module and running `--help` imports neither torch
nor transformers; each subcommand module defers heavy imports to its `run`.
Every module in `posttrain.commands` defines `add_parser(subparsers)`, which
registers its parser with `set_defaults(func=run)`, `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from posttrain import __version__
from posttrain.errors import PosttrainError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="posttrain", description="RL post-training on verifiable tasks, and serving.")
    parser.add_argument("--version", action="version", version=f"posttrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    import posttrain.commands as commands

    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda i: i.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"posttrain.commands.{info.name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except PosttrainError as exc:
        print(f"posttrain {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
