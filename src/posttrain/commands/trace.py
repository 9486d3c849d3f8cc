"""`posttrain trace RUN_DIR`: recent rollouts and per-domain statistics.
`posttrain trace explain ROLLOUT_ID [--run RUN_DIR]`: the full chain of one rollout.
`posttrain trace recover RUN_DIR`: salvage a damaged trace.db into a fresh one (trace/recover.py).
`posttrain trace accounting RUN_DIR`: what became of every task the pool handed out (exit 1 when
a draw is lost or trained twice)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "trace",
        help="recent rollouts and per-domain statistics of a run; `trace explain ROLLOUT_ID` for one rollout's chain; "
        "`trace recover RUN_DIR` to salvage a damaged trace; `trace accounting RUN_DIR`: drawn, trained, dropped by "
        "reason, lost",
        description="posttrain trace RUN_DIR | posttrain trace explain ROLLOUT_ID [--run RUN_DIR] | "
        "posttrain trace recover RUN_DIR | posttrain trace accounting RUN_DIR",
    )
    p.add_argument(
        "run_dir", help="a run directory (or a trace.db file), or the word `explain`, `recover` or `accounting`"
    )
    p.add_argument(
        "rollout_id",
        nargs="?",
        help="with `explain`: the rollout id (a unique prefix is enough); with `recover` or `accounting`: the run "
        "directory",
    )
    p.add_argument("-n", type=int, default=10, help="recent rollouts to show")
    p.add_argument("--domain", help="only this domain")
    p.add_argument(
        "--run", metavar="RUN_DIR", help="with `explain`: the run holding the rollout (default: search ./runs)"
    )
    p.set_defaults(func=run)


def _db_path(arg: str) -> Path:
    from posttrain.errors import ConfigError

    p = Path(arg)
    db = p / "trace.db" if p.is_dir() else p
    if not db.is_file():
        raise ConfigError(f"no trace database at {str(db)!r}")
    return db


def _find(rollout_id: str, run: str | None) -> Path:
    """The trace database holding `rollout_id`: the given run's, else the newest run under ./runs that has it."""
    from posttrain.errors import ConfigError
    from posttrain.trace import TraceStore

    if run:
        return _db_path(run)
    candidates = sorted(Path("runs").glob("*/trace.db"), key=lambda p: p.stat().st_mtime, reverse=True)
    for db in candidates:
        store = TraceStore.read_only(db)
        try:
            if store.has(rollout_id):
                return db
        finally:
            store.close()
    raise ConfigError(f"rollout {rollout_id!r} not found in {len(candidates)} run(s) under ./runs (pass --run RUN_DIR)")


def _explain(args: argparse.Namespace) -> int:
    from posttrain.errors import ConfigError
    from posttrain.trace import TraceStore
    from posttrain.trace.explain import explain

    if not args.rollout_id:
        raise ConfigError("trace explain needs a ROLLOUT_ID (see `posttrain trace RUN_DIR` for ids)")
    store = TraceStore.read_only(_find(args.rollout_id, args.run))
    try:
        print(explain(store, args.rollout_id), end="")
    finally:
        store.close()
    return 0


def _recover(args: argparse.Namespace) -> int:
    from posttrain.errors import ConfigError
    from posttrain.trace.recover import recover

    if not args.rollout_id:
        raise ConfigError("trace recover needs a RUN_DIR (or a trace.db file)")
    db = _db_path(args.rollout_id)
    got = recover(db)
    if got is None:
        print(f"{db} passes SQLite's check; nothing to recover")
        return 0
    kept = ", ".join(f"{n} {table}" for table, n in got.rows.items())
    print(f"recovered {db}: kept {kept}; the damaged file is now {got.damaged}")
    return 0


def _accounting(args: argparse.Namespace) -> int:
    """Print the accounting of a run's draws; 1 when it is not exact (a draw lost, trained twice...)."""
    from posttrain.errors import ConfigError
    from posttrain.trace import TraceStore, readable

    if not args.rollout_id:
        raise ConfigError("trace accounting needs a RUN_DIR (or a trace.db file)")
    db = _db_path(args.rollout_id)
    with readable(db):
        store = TraceStore.read_only(db)
        try:
            got = store.accounting()
        finally:
            store.close()
    print(got.describe(), end="")
    if got.lost and not (db.parent / "eval.json").is_file():
        print("(the run has not finished: a draw with no fate may still be in flight, or the run was killed)")
    return 0 if got.exact else 1


def run(args: argparse.Namespace) -> int:
    from posttrain.trace import readable

    if args.run_dir == "explain" and not Path("explain").is_dir():
        return _explain(args)
    if args.run_dir == "recover" and not Path("recover").is_dir():
        return _recover(args)
    if args.run_dir == "accounting" and not Path("accounting").is_dir():
        return _accounting(args)
    db = _db_path(args.run_dir)
    with readable(db):
        _show(db, args)
    return 0


def _show(db: Path, args: argparse.Namespace) -> None:
    from posttrain.trace import TraceStore

    store = TraceStore.read_only(db)
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
        print(
            f"{r['id']}  {r['domain']:<12} v{r['model_version']:<4} step {step:<5} reward {reward:<7} "
            f"{r['prompt'][:30]!r} -> {r['completion'][:30]!r} {r['reason']}"
        )
    changes = store.events("config_change")  # a resume that changed fields, a branch's source (lineage.py)
    if changes:
        print(f"\n{len(changes)} config change(s) (config_history.jsonl):")
        for ev in changes:
            print(f"  step {ev['step']}: {ev['message']}")
    alarms = store.events("alarm")
    if alarms:
        print(f"\n{len(alarms)} alarm(s):")
        for ev in alarms:
            print(f"  step {ev['step']}: {ev['message']}")
    store.close()
