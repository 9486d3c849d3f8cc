"""The feedback tiers' learning figure (issue 27): `posttrain train configs/feedback.yaml` per seed,
one base and one run over the four families' learnable tiers (code_fix, term_fix, doc_fix,
geo_fix), evaluated as episodes. Prints, per seed and family, the held-out pass rate at the last
turn before and after (with the paired 95% interval of the change), pass@turn-1 and pass@turn-2
after, the share passed at exactly turn 2 with its 95% interval (pass@turn-2 minus pass@turn-1 on
the same items), the stop rates of the tier with an honest stop, and the run's wall and CPU
seconds and peak RSS; then the issue's criteria per seed and family: last-turn pass rate up by
>= 15 points, pass@turn-2 above pass@turn-1 by a margin outside the interval (the turn-2 share's
lower bound above 0), no family falling, the run under 15 minutes.

    .venv/bin/python bench/feedback.py --seeds 0 1 2 [overrides ...]

The base (configs/feedback.yaml's base section, one for every seed) is built first if it is not
cached, and timed apart. Each run is a `posttrain train` subprocess under /usr/bin/time -v.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agentic import ROOT, build_base, train_seed  # noqa: E402

from posttrain.evaluate.stats import wilson  # noqa: E402

CONFIG = ROOT / "configs" / "feedback.yaml"
MIN_GAIN, MAX_WALL_S = 0.15, 900.0


def family_figures(before: dict, after: dict, delta: dict) -> dict:
    """One family's figures from its eval.json results before and after."""
    turns = lambda r: {int(k): v[0] for k, v in r["pass_at_turn"].items()}  # noqa: E731
    b, a = turns(before), turns(after)
    last = max(a)
    scored = [(it[1], n) for it, n in zip(after["items"], after["turns"]) if it[1] is not None]
    at2 = sum(bool(ok) and n == 2 for ok, n in scored)
    lo, hi = wilson(at2, len(scored))
    return {
        "before": b[last],
        "after": a[last],
        "gain": a[last] - b[last],
        "ci": delta["ci"],
        "turn1": a[1],
        "turn2": a[2],
        "at2": (at2 / len(scored) if scored else 0.0, lo, hi),
        "stop_before": before.get("stop_rate"),
        "stop_after": after.get("stop_rate"),
    }


def one_seed(seed: int, overrides: list[str]) -> dict:
    t, table = train_seed(CONFIG, seed, overrides)
    t.pop("stdout")
    fams = {
        name: family_figures(r, table["after"]["domains"][name], table["deltas"]["domains"][name])
        for name, r in table["before"]["domains"].items()
        if r.get("pass_at_turn")
    }
    print(f"seed {seed}: {t['wall_s']:.0f} s wall, {t['cpu_s']:.0f} CPU-s, peak RSS {t['rss_mib']:.0f} MiB", flush=True)
    return {"seed": seed, **t, "families": fams}


def stop_cell(rates: dict | None) -> str:
    if not rates:
        return ""
    return "  stop (cannot / can): " + " / ".join(
        f"{rates[k][0]:.2f} (n={rates[k][3]})" for k in ("infeasible", "feasible")
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    base = build_base(args.overrides, CONFIG)
    status = "cached, this is only its load" if "CACHED" in base["stdout"] else "built"
    print(
        f"base ({status}): {base['wall_s']:.0f} s wall, {base['cpu_s']:.0f} CPU-s, peak RSS {base['rss_mib']:.0f} MiB"
    )
    rows = [one_seed(s, args.overrides) for s in args.seeds]
    print(f"{'seed':>4}  {'family':<10} last turn b->a  gain [paired 95% CI]  after: turn-1 turn-2  at turn 2 [95% CI]")
    for r in rows:
        for name, f in r["families"].items():
            print(
                f"{r['seed']:>4}  {name:<10} {f['before']:.2f}->{f['after']:.2f}     {f['gain']:+.3f} "
                f"[{f['ci'][0]:+.2f},{f['ci'][1]:+.2f}]        {f['turn1']:.2f}   {f['turn2']:.2f}   "
                f"{f['at2'][0]:.2f} [{f['at2'][1]:.2f},{f['at2'][2]:.2f}]"
                + (
                    f"\n{'':>16}before{stop_cell(f['stop_before'])}\n{'':>16}after {stop_cell(f['stop_after'])}"
                    if f["stop_after"]
                    else ""
                )
            )
    names = list(rows[0]["families"])
    for name in names:
        gains = sorted(r["families"][name]["gain"] for r in rows)
        mean = sum(gains) / len(gains)
        sd = (sum((g - mean) ** 2 for g in gains) / max(1, len(gains) - 1)) ** 0.5
        print(
            f"{name}: last-turn gain over {len(rows)} seeds: mean {mean:+.3f} sd {sd:.3f} "
            f"(min {gains[0]:+.3f}, max {gains[-1]:+.3f})"
        )
    walls = sorted(r["wall_s"] for r in rows)
    print(
        f"wall per run: min {walls[0]:.0f} s, max {walls[-1]:.0f} s; "
        f"peak RSS max {max(r['rss_mib'] for r in rows):.0f} MiB"
    )
    for r in rows:
        for name, f in r["families"].items():
            ok = [f["gain"] >= MIN_GAIN - 1e-9, f["at2"][1] > 0.0, f["ci"][1] >= 0 and f["gain"] >= 0]
            print(
                f"seed {r['seed']} {name}: gain >= {MIN_GAIN:+.2f} {'yes' if ok[0] else 'NO'}; pass@turn-2 > "
                f"pass@turn-1 outside the interval {'yes' if ok[1] else 'NO'}; not fallen {'yes' if ok[2] else 'NO'}"
            )
        print(f"seed {r['seed']}: under {MAX_WALL_S:.0f} s {'yes' if r['wall_s'] < MAX_WALL_S else 'NO'}")


if __name__ == "__main__":
    main()
