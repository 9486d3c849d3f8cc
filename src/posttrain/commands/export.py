"""`posttrain export RUN_DIR --out DIR`: a plain Hugging Face model directory to serve.

Invariant: the output is a complete, loadable model directory (config,
weights, tokenizer) or nothing: it is written to a temporary folder and
renamed into place. A LoRA checkpoint is merged into its base (W + (alpha/r) B A);
a full checkpoint's model files are copied without trainer state.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("export", help="export a run's latest checkpoint as a servable model (merges LoRA adapters)")
    p.add_argument("run_dir", help="a run directory (its latest checkpoint) or one checkpoint directory")
    p.add_argument("--out", required=True, help="output model directory (must not exist or be empty)")
    p.add_argument(
        "--base",
        help="base model directory or real model name for a LoRA checkpoint "
        "(default: the run's model.path, else the embedded base)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from posttrain.trainer.export import export

    result = export(Path(args.run_dir), Path(args.out), args.base)
    print(f"exported {result['kind']} checkpoint {result['checkpoint']} -> {result['out']}")
    return 0
