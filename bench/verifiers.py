"""Verifier throughput per domain family: scores per second, one process.

Tasks are sampled first (not timed); then gold and wrong completions are
scored alternately and timed. Math answers that are not string-identical to
the reference go to the math-verify worker process (the wrong half here);
geo runs every script in the sandbox. Peak RSS at the end.

    .venv/bin/python bench/verifiers.py [--scale 1.0]
"""
from __future__ import annotations

import argparse
import resource
import time

from posttrain.domains.registry import all_domains
from posttrain.types import Episode

FAMILIES = {
    "builtin (add/sub/mul/reverse/sort)": (lambda n: n in {"add", "sub", "mul", "reverse", "sort"}, 400),
    "rg_* (reasoning-gym)": (lambda n: n.startswith("rg_"), 2),
    "math_* (math-verify worker)": (lambda n: n.startswith("math_"), 4),
    "doc_* (documents)": (lambda n: n.startswith("doc_"), 10),
    "fin_* (financial statements)": (lambda n: n.startswith("fin_"), 10),
    "sql_* (SQLite, read-only)": (lambda n: n.startswith("sql_"), 6),
    "tool_* (JSON tool world)": (lambda n: n.startswith("tool_"), 10),
    "geo_* (sandboxed mesh scripts)": (lambda n: n.startswith("geo_"), 1),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0, help="multiply tasks per domain")
    args = ap.parse_args()
    domains = all_domains()
    print(f"{'family':<38} {'domains':>7} {'scores':>7} {'scores/s':>9} {'gold/s':>8} {'wrong/s':>8}")
    for family, (pick, per_domain) in FAMILIES.items():
        names = [n for n in domains if pick(n)]
        k = max(1, round(per_domain * args.scale))
        work = []
        for n in names:
            d = domains[n]
            for i in range(k):
                t = d.sample(i, "train", 1 + i % d.levels)
                work.append((d, t, Episode(d.gold(t)), Episode(d.wrong(t))))
        for d, t, g, _ in work[:1]:  # warm workers and imports, untimed
            d.score(t, g)
        times = {"gold": 0.0, "wrong": 0.0}
        for d, t, g, w in work:
            for kind, ep in (("gold", g), ("wrong", w)):
                start = time.perf_counter()
                d.score(t, ep)
                times[kind] += time.perf_counter() - start
        total = times["gold"] + times["wrong"]
        print(f"{family:<38} {len(names):>7} {2 * len(work):>7} {2 * len(work) / total:>9.1f} "
              f"{len(work) / times['gold']:>8.1f} {len(work) / times['wrong']:>8.1f}")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
