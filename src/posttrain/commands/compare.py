"""`posttrain compare A B [CONFIG] [overrides]`: two runs or models on the same held-out items;
per-domain paired deltas with intervals, significant improvements and regressions marked;
a table here, and compare.json / compare.png / compare.html in --out."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="compare two runs or model directories on the same held-out items (paired deltas)"
    )
    p.add_argument("a", metavar="RUN_OR_MODEL_A", help="a run directory (its latest checkpoint) or a model directory")
    p.add_argument("b", metavar="RUN_OR_MODEL_B", help="the other one; deltas are B - A")
    p.add_argument("config", nargs="?", help="YAML config (domains, eval settings) when neither side is a run")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. eval.samples=0")
    p.add_argument("--heldout", metavar="FILE", help="a stored held-out set (default: the first run's heldout.json)")
    p.add_argument(
        "--out", metavar="DIR", help="where compare.json/.png/.html go (default: B's run dir/compare, else ./compare)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from posttrain.configs import load_config, split_cli_args
    from posttrain.evaluate.compare import heldout_of, resolve, run_compare, text, write_outputs

    a, b = resolve(args.a), resolve(args.b)
    config, overrides = split_cli_args(args.config, args.overrides)
    run_cfg = next((s.run_dir / "config.yaml" for s in (a, b) if s.run_dir is not None), None)
    cfg = load_config(config or run_cfg, overrides)
    import torch

    from posttrain.evaluate.run import heldout_for, options

    torch.set_num_threads(cfg.run.threads)

    def build():
        from posttrain.tasks.pool import TaskPool

        pool = TaskPool(cfg.tasks, seed=cfg.run.seed)
        return heldout_for(cfg.eval, {n: pool.eval_difficulty(n) for n in pool.names})

    heldout = heldout_of(a, b, args.heldout, build)
    device = (
        "cpu"
        if cfg.model.device == "auto" and not torch.cuda.is_available()
        else ("cuda" if cfg.model.device == "auto" else cfg.model.device)
    )
    ta, tb, data = run_compare(
        a, b, heldout, options(cfg.eval, tasks=cfg.tasks, progress=cfg.run.progress), device, cfg.eval.seed
    )
    print(text(a, b, ta, tb, data))
    out = Path(args.out) if args.out else (b.run_dir / "compare" if b.run_dir else Path("compare"))
    js, png, page = write_outputs(out, data)
    print(f"compare: {page} ({js.name}, {png.name})")
    return 0
