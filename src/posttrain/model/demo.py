"""The demo's one-line verdict: did `make demo` show what it claims?

Invariant: the verdict reads only the run's `eval.json` (held-out accuracy before
and after training, greedy, seeded) and says PASS exactly when the held-out mean
gained at least MIN_GAIN and no domain ended more than MAX_FALL below where it
started; otherwise FAIL, naming each criterion that failed. A domain without an
accuracy (every item an infra error) is a FAIL, never counted as 0. The paired
95% interval of the mean gain is appended when the table carries it.

    python -m posttrain.model.demo runs/<run>      # prints the line; exit 0 on PASS, 1 on FAIL
    python -m posttrain.model.demo runs/<run> --min-gain 0.15 --bench BEFORE.json AFTER.json

`make demo-real` asks for its own gain (+15 points) and passes the real benchmarks'
tables (`posttrain eval --bench ... --json`) of the base and of the trained model: they
are printed before the verdict, each benchmark's accuracy with its interval before and
after (forgetting shown), and are no criterion of it (nothing trains on them).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

MIN_GAIN = 0.20
"""Held-out mean accuracy the run must gain (0.20 = 20 points)."""
MAX_FALL = 0.02
"""How far below its start any single domain may end."""


def verdict(before: Mapping[str, float], after: Mapping[str, float], min_gain: float = MIN_GAIN) -> tuple[bool, str]:
    """(passed, one line) from per-domain held-out accuracies before and after."""
    if not before or set(before) != set(after):
        return (
            False,
            f"demo: FAIL the evaluation tables do not cover the same domains ({sorted(before)} vs {sorted(after)})",
        )
    b, a = sum(before.values()) / len(before), sum(after.values()) / len(after)
    deltas = {d: after[d] - before[d] for d in before}
    improved = sum(v > 0 for v in deltas.values())
    fell = {d: v for d, v in deltas.items() if v < -MAX_FALL - 1e-9}
    head = f"held-out mean {b:.2f} -> {a:.2f} ({a - b:+.2f}), {improved}/{len(deltas)} domains improved"
    why = []
    if a - b < min_gain - 1e-9:
        why.append(f"gain {a - b:+.2f} is below the demo's {min_gain:+.2f}")
    if fell:
        why.append(
            "fell more than {:.0f} points: {}".format(
                MAX_FALL * 100, ", ".join(f"{d} {before[d]:.2f} -> {after[d]:.2f}" for d, v in sorted(fell.items()))
            )
        )
    if why:
        return False, f"demo: FAIL {head}; " + "; ".join(why)
    return True, f"demo: PASS {head}, no domain fell more than {MAX_FALL * 100:.0f} points"


def verdict_of_run(run_dir: str | Path, min_gain: float = MIN_GAIN) -> tuple[bool, str]:
    path = Path(run_dir) / "eval.json"
    if not path.is_file():
        return False, f"demo: FAIL no evaluation table at {path} (did the run finish?)"
    table = json.loads(path.read_text())
    if not table.get("after"):
        return False, f"demo: FAIL {path} has no after-training evaluation"
    missing = sorted(
        d for t in (table["before"], table["after"]) for d, r in t["domains"].items() if r["accuracy"] is None
    )
    if missing:
        return False, f"demo: FAIL no held-out accuracy for {', '.join(missing)} (every item an infra error)"
    acc = lambda t: {d: r["accuracy"] for d, r in t["domains"].items()}  # noqa: E731
    ok, line = verdict(acc(table["before"]), acc(table["after"]), min_gain)
    mean = (table.get("deltas") or {}).get("mean")
    if mean and mean.get("ci"):
        line += f" (95% interval of the gain {mean['ci'][0]:+.2f} to {mean['ci'][1]:+.2f})"
    return ok, line


def bench_lines(before: str | Path, after: str | Path) -> list[str]:
    """One line a benchmark: its accuracy and 95% interval in `before` and in `after`, two
    tables `posttrain eval --bench ... --json` wrote (a benchmark in one table only, or a file
    that is missing or not such a table, says so on its line)."""
    tables = []
    for path in (before, after):
        try:
            tables.append(json.loads(Path(path).read_text())["domains"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return [f"benchmarks: no table at {path} ({type(exc).__name__}: {exc})"]

    def cell(row: Mapping | None) -> str:
        if row is None or row.get("accuracy") is None:
            return "n/a"
        lo, hi = row.get("ci") or (None, None)
        span = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else ""
        return f"{row['accuracy']:.2f}{span} (n={row.get('n', '?')})"

    return [
        f"benchmark {name}: {cell(tables[0].get(name))} -> {cell(tables[1].get(name))}"
        for name in sorted(set(tables[0]) | set(tables[1]))
    ]


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m posttrain.model.demo", description="the demo's one-line verdict")
    p.add_argument("run_dir")
    p.add_argument("--min-gain", type=float, default=MIN_GAIN, help=f"held-out mean gain to pass (default {MIN_GAIN})")
    p.add_argument(
        "--bench", nargs=2, metavar=("BEFORE", "AFTER"), help="benchmark tables (eval --bench --json) to print"
    )
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.bench:
        for line in bench_lines(*args.bench):
            print(line)
    ok, line = verdict_of_run(args.run_dir, args.min_gain)
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
