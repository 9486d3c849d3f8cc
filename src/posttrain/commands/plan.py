"""`posttrain plan RUN_DIR --cluster FILE [--json FILE] [--png FILE]`: predict a cluster's
steps per hour, stage utilisation, bottleneck and best worker split from a finished run's trace."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="capacity plan: replay a finished run's trace on a described cluster")
    p.add_argument("run_dir", help="a finished run directory (trace.db, metrics.jsonl, config.yaml)")
    p.add_argument(
        "--cluster", required=True, metavar="FILE", help="the cluster file (YAML or JSON; docs/scale-out.md)"
    )
    p.add_argument("--json", metavar="FILE", help="also write the plan as JSON here")
    p.add_argument("--png", metavar="FILE", help="where the plot goes (default: RUN_DIR/plan.png)")
    p.add_argument("--seed", type=int, default=0, help="the simulation's first seed")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from posttrain.plan import load_cluster, plan_run
    from posttrain.plan.output import text, write_json, write_png

    plan = plan_run(args.run_dir, load_cluster(args.cluster), seed=args.seed)
    print(text(plan))
    if args.json:
        print(f"plan: {write_json(plan, Path(args.json))}")
    print(f"plan: {write_png(plan, Path(args.png) if args.png else Path(args.run_dir) / 'plan.png')}")
    return 0
