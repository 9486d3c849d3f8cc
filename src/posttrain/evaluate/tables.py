"""Plain-text tables and eval.json: every accuracy with its interval, deltas paired.

Invariant: a table's `n` is the number of distinct tasks scored; a domain
with no scorable item prints `infra` (never 0.000); a delta is marked `*`
only when its paired interval excludes 0 and the exact McNemar test agrees.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posttrain.evaluate.core import DomainResult, EvalTable
from posttrain.evaluate.stats import PairedDelta, paired_deltas


def _acc(r: DomainResult | None) -> str:
    if r is None:
        return f"{'':>22}"
    if r.n == 0:
        return f"{'no items':>22}"
    if r.accuracy is None:
        return f"{'infra (' + str(r.infra_errors) + ' errors)':>22}"
    return f"{r.accuracy:>7.3f} [{r.low:.2f},{r.high:.2f}]{'':>3}"


def _n(r: DomainResult) -> str:
    text = f"{r.scored}" + (f"/{r.requested}!" if r.n < r.requested else "")
    return f"{text:>9}"


def _delta(d: PairedDelta | None) -> str:
    if d is None or not d.n:
        return ""
    return f"{d.delta:>+8.3f} [{d.low:+.2f},{d.high:+.2f}] {'*' if d.significant else ' '}"


def deltas(
    before: EvalTable, after: EvalTable, seed: int = 0, probes: bool = False
) -> tuple[dict[str, PairedDelta], PairedDelta | None]:
    """Paired before/after deltas per domain (with `probes`: per probe) over the items both
    scored, and of the mean."""
    b, a = (before.probes, after.probes) if probes else (before.results, after.results)
    return paired_deltas({k: r.verdicts for k, r in b.items()}, {k: r.verdicts for k, r in a.items()}, seed)


def deltas_json(before: EvalTable, after: EvalTable, seed: int = 0) -> dict[str, Any]:
    """eval.json's `deltas`: paired deltas per domain, of the mean, and per probe."""
    per, mean = deltas(before, after, seed)
    return {
        "domains": {k: delta_json(v) for k, v in per.items()},
        "mean": delta_json(mean),
        "probes": {k: delta_json(v) for k, v in deltas(before, after, seed, probes=True)[0].items()},
    }


def format_table(before: EvalTable, after: EvalTable | None = None, labels: tuple[str, str] | None = None) -> str:
    """Core held-out accuracy with 95% Wilson intervals; with `after`, paired deltas and marks.
    Columns are headed by `labels`, by default "before" and "after" for two tables and
    "accuracy" for one (a single model's evaluation has no before)."""
    labels = labels or (("before", "after") if after else ("accuracy", ""))
    per, mean = deltas(before, after) if after else ({}, None)
    head = f"{'domain':<22}{'level':>6}{'n':>9}{labels[0] + ' [95% CI]':>22}"
    if after:
        head += f"{labels[1] + ' [95% CI]':>22}{'delta [95% CI]':>24}"
    lines = [head]
    for name, b in before.results.items():
        row = f"{name:<22}{b.difficulty:>6}{_n(b)}{_acc(b)}"
        if after:
            row += _acc(after.results.get(name)) + "  " + _delta(per.get(name))
        lines.append(row.rstrip())
    lo, hi = before.mean_interval()
    row = f"{'mean over domains':<22}{'':>6}{'':>9}{before.mean_accuracy:>7.3f} [{lo:.2f},{hi:.2f}]{'':>3}"
    if after:
        alo, ahi = after.mean_interval()
        row += f"{after.mean_accuracy:>7.3f} [{alo:.2f},{ahi:.2f}]{'':>3}  " + _delta(mean)
    lines.append(row.rstrip())
    short = [f"{k} {r.scored}/{r.requested}" for k, r in before.results.items() if r.n < r.requested]
    notes = [
        "n: distinct tasks scored; [lo,hi]: 95% Wilson interval; delta: paired bootstrap interval, "
        "* = interval excludes 0 and exact McNemar p < 0.05"
    ]
    if short:
        notes.append("! the eval split holds fewer distinct tasks than asked: " + ", ".join(short))
    return "\n".join(lines + notes)


def format_details(table: EvalTable) -> str:
    """Training vs eval verifier pass rates, sampled metrics, the generalisation probes and the rotation slice."""
    lines = [f"{'domain':<22}{'train verifier':>16}{'eval verifier':>15}{'gap':>8}  eval verifier"]
    for name, r in table.results.items():
        if r.accuracy is None or r.train_accuracy is None:
            continue
        gap = r.train_accuracy - r.accuracy
        lines.append(f"{name:<22}{r.train_accuracy:>16.3f}{r.accuracy:>15.3f}{gap:>+8.3f}  {r.eval_verifier}")
    sampled = {k: r.sampling for k, r in table.results.items() if r.sampling}
    if sampled:
        keys = sorted({m for s in sampled.values() for m in s}, key=lambda m: (m.split("@")[0], int(m.split("@")[1])))
        lines.append(f"{'sampled':<22}" + "".join(f"{m:>20}" for m in keys))
        for name, s in sampled.items():
            lines.append(
                f"{name:<22}"
                + "".join(f"{s[m][0]:>7.3f} [{s[m][1]:.2f},{s[m][2]:.2f}]" if m in s else f"{'':>20}" for m in keys)
            )
    if table.rotation:
        lines.append("rotation slice (fresh items, not in the core set):")
        lines += [f"  {r.domain:<20}{r.difficulty:>6}{_n(r)}{_acc(r)}".rstrip() for r in table.rotation.values()]
    return "\n".join(lines)


def format_probes(
    before: EvalTable, after: EvalTable | None = None, labels: tuple[str, str] = ("before", "after")
) -> str:
    """The generalisation probes apart from the core: one level above the trained one, and
    families never trained on; with `after`, paired deltas."""
    per = deltas(before, after, probes=True)[0] if after else {}
    lines = []
    for kind, title in (
        ("above", "held-out one level above the trained one"),
        ("transfer", "families never trained on (transfer)"),
    ):
        keys = [k for k in before.probes if k.startswith(kind + ":")]
        if not keys:
            continue
        lines.append(f"{title}:" + (f"{'':>9}{labels[0]:>19}{labels[1]:>22}" if after else ""))
        for key in keys:
            b = before.probes[key]
            row = f"  {b.domain:<20}{b.difficulty:>6}{_n(b)}{_acc(b)}"
            if after:
                row += _acc(after.probes.get(key)) + "  " + _delta(per.get(key))
            lines.append(row.rstrip())
    return "\n".join(lines)


def format_turns(
    before: EvalTable, after: EvalTable | None = None, labels: tuple[str, str] = ("before", "after")
) -> str:
    """pass@turn-k of each multi-turn domain (passed using at most k turns), k = 1..its turn budget,
    with 95% Wilson intervals, and under it the share converted at each turn k >= 2 (pass@turn-k
    minus pass@turn-(k-1), the items a revision fixed, with its interval), and for a domain with
    an honest stop its stop rate on the tasks that cannot be met and on those that can; with
    `after`, both sides. Empty when no domain is multi-turn."""
    lines = []
    for name, b in before.results.items():
        a = after.results.get(name) if after else None
        sides = [(labels[0], b)] + ([(labels[1], a)] if a is not None else [])
        if not any(r.pass_at_turn for _, r in sides):
            continue
        if not lines:
            lines.append("pass@turn-k (multi-turn domains: passed using at most k turns):")
        for label, r in sides:
            cells = "".join(f"  turn-{k} {v:.3f} [{lo:.2f},{hi:.2f}]" for k, (v, lo, hi) in r.pass_at_turn.items())
            lines.append(f"  {name:<20}{label:>7}{cells}")
            if r.turn_gain:
                gain = "".join(
                    f"  turn-{k} +{v:.3f} [{lo:.2f},{hi:.2f}] ({c} of {r.scored})"
                    for k, (v, lo, hi, c) in r.turn_gain.items()
                )
                lines.append(f"  {'':<20}{'':>7}  converted:{gain}")
            if r.stop_rates:
                stop = "".join(
                    f"  {kind} {v:.3f} [{lo:.2f},{hi:.2f}] (n={n})" for kind, (v, lo, hi, n) in r.stop_rates.items()
                )
                lines.append(f"  {'':<20}{'':>7}  stop rate:{stop}")
    return "\n".join(lines)


def delta_json(d: PairedDelta | None) -> dict[str, Any] | None:
    if d is None:
        return None
    return {
        "n": d.n,
        "before": d.before,
        "after": d.after,
        "delta": d.delta,
        "ci": [d.low, d.high],
        "improved": d.improved,
        "regressed": d.regressed,
        "p_value": d.p_value,
        "significant": d.significant,
    }


def write_table(
    path: Path,
    before: EvalTable,
    after: EvalTable | None,
    history: Sequence[tuple[int, EvalTable]] = (),
    extra: Mapping[str, Any] | None = None,
) -> None:
    """eval.json: before, after, paired deltas, the history of evaluations during training, and `extra`
    (held-out set, contamination and exposure reports); written whole or not at all."""
    data: dict[str, Any] = {"before": before.to_json(), "after": after.to_json() if after else None}
    if after:
        data["deltas"] = deltas_json(before, after)
    data["history"] = [{"step": s, **t.to_json()} for s, t in history]
    data.update(extra or {})
    tmp = path.with_name(f".{path.name}.tmp")  # renamed into place: a crash never leaves half a table
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
