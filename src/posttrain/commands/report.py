"""`posttrain report RUN_DIR [RUN_DIR ...] [--out FILE]`: write a self-contained HTML report of a
run, or one page that overlays several runs' curves."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write RUN_DIR/report.html: training curves, samples, held-out before/after, probes, alarms; "
        "with several runs, one page overlaying them (RUN_DIR/overlay.html)",
    )
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a run directory; several: overlay them")
    p.add_argument(
        "--out",
        metavar="FILE",
        help="where to write the page (default: RUN_DIR/report.html, or the first RUN_DIR/overlay.html for several)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posttrain.report import write_report

    first, *others = args.run_dirs
    print(f"report: {write_report(first, args.out, others)}")
    return 0
