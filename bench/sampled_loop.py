"""The coding loop at the sampling temperature, before and after RL: per-model figures with
intervals, over seeds, from `posttrain eval --json` files (issue 37's coding-loop bar).

Each file is one model's `posttrain eval ... eval.samples=N --json FILE` on a multi-turn domain;
it carries the per-item values behind the sampled figures (`sampling_items`). For each trained
model this prints, with 95% intervals from a bootstrap over items (the item is the unit: its
samples are not independent draws; the eval's own normal interval beside it):

- pass1-by-turn@1 and @T (T the turn budget) and `converted-at-turn@t` summed over t >= 2:
  the revision's conversions (pass@turn-T minus pass@turn-1 of the same samples);
- the items the conversions fell on, and the share of failed first turns converted;
- what a fresh attempt would convert: had the last turn been a new first-turn sample, independent
  of the failed one, an item with first-turn pass rate p converts (1 - p) x p of its samples (the
  reference a revision that reads the failure should beat; exact for a budget of 2);
- the last turn minus the base's, paired by item (the same held-out items, the same seeds of
  sampling);
- the share of samples whose revision is the failed attempt again (`repeated-at-turn@t`, summed
  over t >= 2), where the files carry it.

With `--control pyfunc_retry` every file must also hold that domain, evaluated in the same command:
the same items told only how many visible tests failed. Per model it prints the conversions with the
failure's text and without it and their difference paired by item: a revision that reads the failure
converts more with it; one that merely tries again, as many.

    .venv/bin/python bench/sampled_loop.py --base BASE.json --trained S0.json S1.json S2.json \
        [--domain pyfunc_revise] [--control pyfunc_retry] [--boot 10000] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posttrain.evaluate.stats import mean_over_domains_interval


def load_items(path: Path, domain: str) -> tuple[int, dict[str, dict[str, float]], dict[str, Any]]:
    """(turn budget, item id -> metric -> value, the eval's own sampled figures) of `domain` in an
    eval JSON; a clear error for a file without them."""
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"bench/sampled_loop.py: cannot read {path}: {e}") from None
    res = d.get("domains", {}).get(domain)
    if res is None:
        raise SystemExit(f"bench/sampled_loop.py: {path} has no domain {domain!r} (has {sorted(d.get('domains', {}))})")
    budget, items = int(res.get("turn_budget", 0)), res.get("sampling_items") or {}
    if budget < 2 or not items:
        raise SystemExit(
            f"bench/sampled_loop.py: {path}: {domain} has no sampled multi-turn figures per item "
            "(run posttrain eval with eval.samples > 0 on a multi-turn domain, at a version that writes sampling_items)"
        )
    return budget, {k: dict(v) for k, v in items.items()}, dict(res.get("sampling", {}))


def with_intervals(cols: Mapping[str, Sequence[float]], boot: int, seed: int) -> dict[str, Any]:
    """{"items": n} and each column's (mean, low, high) over its per-item values: evaluate/stats.py's
    bootstrap (items resampled, 95% percentiles), the items as one "domain"."""
    out: dict[str, Any] = {"items": len(next(iter(cols.values())))}
    for key, vals in cols.items():
        out[key] = (statistics.fmean(vals), *mean_over_domains_interval({key: vals}, seed, boot))
    return out


def converted(values: Mapping[str, float], budget: int, metric: str = "converted") -> float:
    """One item's share of samples a revision converted (passed at some turn t >= 2), or with
    metric="repeated" the share whose revision handed back the attempt before it."""
    return sum(values.get(f"{metric}-at-turn@{t}", 0.0) for t in range(2, budget + 1))


def by_item(items: Mapping[str, Mapping[str, float]]) -> dict[str, Mapping[str, float]]:
    """The values keyed by the item's place (split:level:index) without its domain's name, so a
    control domain's items (`draws_as`) pair with the loop's."""
    return {k.split(":", 1)[-1]: v for k, v in items.items()}


def control(
    loop: Mapping[str, Mapping[str, float]],
    ctl: Mapping[str, Mapping[str, float]],
    budget: int,
    boot: int,
    seed: int,
) -> dict[str, Any]:
    """One model's conversions with the failure's text (`loop`) and told only the count (`ctl`),
    paired by item, each (mean, low, high); the difference's interval from the same bootstrap."""
    a, b = by_item(loop), by_item(ctl)
    ids = sorted(set(a) & set(b))
    if not ids:
        raise SystemExit("bench/sampled_loop.py: the loop and its control share no sampled item")
    cols = {
        "turn1": [a[i]["pass1-by-turn@1"] for i in ids],
        "turn1_control": [b[i]["pass1-by-turn@1"] for i in ids],
        "converted": [converted(a[i], budget) for i in ids],
        "converted_control": [converted(b[i], budget) for i in ids],
        "difference": [converted(a[i], budget) - converted(b[i], budget) for i in ids],
    }
    if all("repeated-at-turn@2" in a[i] and "repeated-at-turn@2" in b[i] for i in ids):
        cols["repeated"] = [converted(a[i], budget, "repeated") for i in ids]
        cols["repeated_control"] = [converted(b[i], budget, "repeated") for i in ids]
    return with_intervals(cols, boot, seed)


def control_report(rows: Mapping[str, Mapping[str, Any]], domain: str, ctl: str) -> str:
    def f(t: tuple[float, float, float] | None, sign: bool = False) -> str:
        if t is None:
            return "n/a"
        fmt = "{:+.3f}" if sign else "{:.3f}"
        return f"{fmt.format(t[0])} [{fmt.format(t[1])}, {fmt.format(t[2])}]"

    lines = [
        f"| model | by turn 1 ({domain} / {ctl}) | converted with the failure ({domain}) | told only the count "
        f"({ctl}) | difference, paired by item | revision repeats the attempt ({domain} / {ctl}) |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        rep = f"{r['repeated'][0]:.3f} / {r['repeated_control'][0]:.3f}" if "repeated" in r else "n/a"
        lines.append(
            f"| {name} | {r['turn1'][0]:.3f} / {r['turn1_control'][0]:.3f} | {f(r['converted'])} | "
            f"{f(r['converted_control'])} | {f(r['difference'], True)} | {rep} |"
        )
    return "\n".join(lines)


def figures(
    base: Mapping[str, Mapping[str, float]],
    model: Mapping[str, Mapping[str, float]],
    budget: int,
    boot: int,
    seed: int,
) -> dict[str, Any]:
    """A trained model's figures on the items both files sampled, each (mean, low, high)."""
    ids = sorted(set(base) & set(model))
    if not ids:
        raise SystemExit("bench/sampled_loop.py: the base and a trained model share no sampled item")
    last = f"pass1-by-turn@{budget}"
    cols = {
        "turn1": [model[i]["pass1-by-turn@1"] for i in ids],
        "last": [model[i][last] for i in ids],
        "converted": [converted(model[i], budget) for i in ids],
        # the reference: had turn 2 been a fresh first-turn sample, independent of the first, an item
        # with first-turn pass rate p would convert (1 - p) x p of its samples (budget 2)
        "fresh": [(1 - model[i]["pass1-by-turn@1"]) * model[i]["pass1-by-turn@1"] for i in ids],
        "gain": [model[i][last] - base[i][last] for i in ids],
        **(
            {"repeated": [converted(model[i], budget, "repeated") for i in ids]}
            if all("repeated-at-turn@2" in model[i] for i in ids)
            else {}
        ),
        "base_last": [base[i][last] for i in ids],
        "base_converted": [converted(base[i], budget) for i in ids],
    }
    out = with_intervals(cols, boot, seed)
    out["converted_on"] = [i for i in ids if converted(model[i], budget) > 0]
    failed = sum(1 - v for v in cols["turn1"])
    out["converted_given_failed"] = sum(cols["converted"]) / failed if failed else 0.0
    if "repeated" in cols:
        out["repeated_given_failed"] = sum(cols["repeated"]) / failed if failed else 0.0
    return out


def report(rows: Mapping[str, Mapping[str, Any]], budget: int) -> str:
    def f(t: tuple[float, float, float], sign: bool = False) -> str:
        fmt = "{:+.3f}" if sign else "{:.3f}"
        return f"{fmt.format(t[0])} [{fmt.format(t[1])}, {fmt.format(t[2])}]"

    turns = "turn 2" if budget == 2 else f"turns 2-{budget}"
    lines = [
        f"| model | by turn 1 | by turn {budget} | converted at {turns} (items with one) "
        "| of the failed first turns | a fresh attempt would convert | last turn - base, paired by item |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {f(r['turn1'])} | {f(r['last'])} | {f(r['converted'])} ({len(r['converted_on'])} of "
            f"{r['items']}) | {r['converted_given_failed']:.3f} | {f(r['fresh'])} | {f(r['gain'], True)} |"
        )
    gains = [r["gain"][0] for r in rows.values()]
    conv = [r["converted"][0] for r in rows.values()]
    lines += [
        "",
        f"over {len(rows)} trained models: converted mean {statistics.fmean(conv):.3f} "
        f"[min {min(conv):.3f}, max {max(conv):.3f}]; last turn - base mean {statistics.fmean(gains):+.3f} "
        f"[min {min(gains):+.3f}, max {max(gains):+.3f}]",
        "(95% intervals: percentile bootstrap over items; the base's own figures in each row's paired column)",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/sampled_loop.py", description=__doc__.splitlines()[0])
    p.add_argument("--base", type=Path, required=True, help="the base model's eval JSON")
    p.add_argument("--trained", type=Path, nargs="+", required=True, help="each trained model's eval JSON")
    p.add_argument("--domain", default="pyfunc_revise")
    p.add_argument("--control", default=None, help="the control domain in the same files (e.g. pyfunc_retry)")
    p.add_argument("--boot", type=int, default=10_000, help="bootstrap resamples (10000)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.boot < 100:
        p.error("--boot must be >= 100")
    budget, base, base_fig = load_items(args.base, args.domain)
    rows = {}
    for path in args.trained:
        b, model, fig = load_items(path, args.domain)
        if b != budget:
            raise SystemExit(f"bench/sampled_loop.py: {path} has turn budget {b}, the base {budget}")
        rows[path.stem] = figures(base, model, budget, args.boot, args.seed)
        rows[path.stem]["eval_converted"] = fig.get(f"converted-at-turn@{budget}")
    any_row = next(iter(rows.values()))
    print(
        f"base ({args.base.name}): by turn 1 {statistics.fmean(v['pass1-by-turn@1'] for v in base.values()):.3f}, "
        f"by turn {budget} {any_row['base_last'][0]:.3f}, converted {any_row['base_converted'][0]:.3f} "
        f"[{any_row['base_converted'][1]:.3f}, {any_row['base_converted'][2]:.3f}] (the eval's own: "
        f"{base_fig.get(f'converted-at-turn@{budget}')})"
    )
    print(report(rows, budget))
    for name, r in rows.items():
        rep = (
            f"; the revision repeats the attempt in {r['repeated'][0]:.3f} of samples "
            f"({r['repeated_given_failed']:.3f} of the failed first turns)"
            if "repeated" in r
            else ""
        )
        print(
            f"{name}: conversions on {', '.join(r['converted_on']) or 'no item'}; the eval's own converted "
            f"(normal interval over items): {r['eval_converted']}{rep}"
        )
    if args.control:
        ctl_rows = {}
        for path in [args.base, *args.trained]:
            _, loop, _ = load_items(path, args.domain)
            b, ctl, _ = load_items(path, args.control)
            if b != budget:
                raise SystemExit(
                    f"bench/sampled_loop.py: {path}: {args.control} has turn budget {b}, {args.domain} {budget}"
                )
            ctl_rows[path.stem] = control(loop, ctl, budget, args.boot, args.seed)
        print()
        print(control_report(ctl_rows, args.domain, args.control))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
