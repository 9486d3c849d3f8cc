"""`posttrain report RUN_DIR [--out FILE]`: write a self-contained HTML report of a run."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write RUN_DIR/report.html: curves, held-out before/after, probes, alarms")
    p.add_argument("run_dir", help="a run directory")
    p.add_argument("--out", metavar="FILE", help="where to write the page (default: RUN_DIR/report.html)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posttrain.report import write_report

    print(f"report: {write_report(args.run_dir, args.out)}")
    return 0
