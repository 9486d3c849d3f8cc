"""`posttrain trace RUN_DIR`: recent rollouts and per-domain statistics."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="recent rollouts and per-domain statistics of a run")
    p.add_argument("run_dir", help="a run directory (or a trace.db file)")
    p.add_argument("-n", type=int, default=10, help="recent rollouts to show")
    p.add_argument("--domain", help="only this domain")
    p.set_defaults(func=run)


def _db_path(arg: str) -> Path:
    from posttrain.errors import ConfigError

    p = Path(arg)
    db = p / "trace.db" if p.is_dir() else p
    if not db.is_file():
        raise ConfigError(f"no trace database at {str(db)!r}")
    return db


def run(args: argparse.Namespace) -> int:
    from posttrain.trace import TraceStore

    store = TraceStore(_db_path(args.run_dir))
    print(f"{'domain':<20}{'rollouts':>9}{'reward':>8}{'pass':>7}{'errors':>7}{'trunc':>7}{'used':>7}")
    for s in store.domain_stats():
        print(
            f"{s['domain']:<20}{s['rollouts']:>9}{(s['mean_reward'] or 0):>8.3f}{(s['pass_rate'] or 0):>7.3f}"
            f"{s['errors']:>7}{s['truncated']:>7}{s['consumed']:>7}"
        )
    print()
    for r in store.recent(args.n, args.domain):
        reward = "masked" if r["reward"] is None else f"{r['reward']:.2f}"
        step = "-" if r["train_step"] is None else r["train_step"]
        print(f"{r['id']}  {r['domain']:<12} v{r['model_version']:<4} step {step:<5} reward {reward:<7} "
              f"{r['prompt'][:30]!r} -> {r['completion'][:30]!r} {r['reason']}")
    store.close()
    return 0
