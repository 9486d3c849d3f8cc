"""`posttrain eval [--model DIR] [CONFIG] [overrides]`: held-out accuracy per domain."""
from __future__ import annotations

import argparse
import json


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="held-out accuracy per domain of a model (seeded, greedy)")
    p.add_argument("config", nargs="?", help="YAML config naming the domains and eval settings")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. eval.tasks_per_domain=50")
    p.add_argument("--model", metavar="DIR", help="a local Hugging Face model directory (default: the embedded base)")
    p.add_argument("--json", metavar="FILE", help="also write the table as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from posttrain.config import load_config, split_cli_args

    config, overrides = split_cli_args(args.config, args.overrides)
    cfg = load_config(config, overrides)
    from posttrain.engine.hf import HFEngine
    from posttrain.evaluate import evaluate, format_table
    from posttrain.model.pretrain import ensure_base
    from posttrain.tasks.pool import TaskPool

    import torch

    torch.set_num_threads(cfg.run.threads)
    pool = TaskPool(cfg.tasks, seed=cfg.run.seed)
    engine = HFEngine.from_pretrained(args.model or cfg.model.path or ensure_base(cfg.base), device=cfg.model.device, seed=cfg.run.seed)
    table = evaluate(engine, {n: pool.eval_difficulty(n) for n in pool.names}, cfg.eval.tasks_per_domain, cfg.eval.max_tokens)
    print(format_table(table))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table.to_json(), f, indent=2)
    return 0
