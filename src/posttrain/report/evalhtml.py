"""The evaluation parts of the HTML report: tables with intervals, curves with bands, checks.

Invariant: every figure shown comes from eval.json, checks.json or the eval
rows of metrics.jsonl as written; a domain without a scorable item shows
`infra`, never 0; text from the run is HTML-escaped; a part whose source
is absent renders as a short "no data" note.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from posttrain.report.data import RunData

_CSS_EXTRA = "h3{font-size:14px;margin:16px 0 6px}"


def _e(x: Any) -> str:
    return html.escape(str(x))


def _acc(r: Mapping[str, Any] | None) -> str:
    if not r:
        return "<td></td>"
    if not r.get("n"):
        return '<td class="empty">no items</td>'
    if r.get("accuracy") is None:
        return f'<td class="alarm">infra ({r.get("infra_errors", 0)} errors)</td>'
    lo, hi = r.get("ci", (0.0, 1.0))
    return f'<td>{r["accuracy"]:.3f} <span class="meta">[{lo:.2f}, {hi:.2f}]</span></td>'


def _n(r: Mapping[str, Any]) -> str:
    scored, req = r.get("scored", r.get("n", 0)), r.get("requested", r.get("n", 0))
    return f"{scored}" + (
        f' <span class="alarm" title="the eval split holds fewer distinct tasks">of {req} asked</span>'
        if r.get("n", 0) < req
        else ""
    )


def _delta(d: Mapping[str, Any] | None) -> str:
    if not d or not d.get("n"):
        return "<td></td>"
    cls = ("pos" if d["delta"] > 0 else "neg") if d["significant"] else ""
    mark = " *" if d["significant"] else ""
    lo, hi = d["ci"]
    return f'<td class="{cls}">{d["delta"]:+.3f}{mark} <span class="meta">[{lo:+.2f}, {hi:+.2f}]</span></td>'


def before_after_table(table: Mapping[str, Any], labels: tuple[str, str] = ("before", "after")) -> str:
    before, after = table["before"], table.get("after") or {}
    deltas = (table.get("deltas") or {}).get("domains", {})
    rows = [
        f'<tr><th class="l">domain</th><th>level</th><th>n (distinct)</th><th>{labels[0]} [95% CI]</th>'
        f"<th>{labels[1]} [95% CI]</th><th>delta [paired 95% CI]</th></tr>"
    ]
    for name, b in before["domains"].items():
        a = after.get("domains", {}).get(name)
        rows.append(
            "<tr><td "
            f'class="l">{_e(name)}</td><td>{b.get("difficulty")}</td><td>{_n(b)}</td>{_acc(b)}{_acc(a)}{_delta(deltas.get(name))}</tr>'
        )
    mean = (table.get("deltas") or {}).get("mean")
    blo, bhi = before.get("mean_ci", (0, 1))
    cells = f'<td>{before["mean_accuracy"]:.3f} <span class="meta">[{blo:.2f}, {bhi:.2f}]</span></td>'
    if after:
        alo, ahi = after.get("mean_ci", (0, 1))
        cells += f'<td>{after["mean_accuracy"]:.3f} <span class="meta">[{alo:.2f}, {ahi:.2f}]</span></td>{_delta(mean)}'
    rows.append(f'<tr><th class="l">mean over domains</th><td></td><td></td>{cells}</tr>')
    note = (
        '<p class="meta">n: distinct tasks scored (infra errors left out); 95% Wilson intervals; deltas paired over '
        "the "
        "same items (bootstrap interval), * where it excludes 0 and the exact McNemar test agrees (p &lt; 0.05).</p>"
    )
    return "<table>" + "".join(rows) + "</table>" + note


def verifier_table(result: Mapping[str, Any]) -> str:
    rows = [
        '<tr><th class="l">domain</th><th>training verifier</th><th>eval verifier</th><th>gap</th><th class="l">eval '
        "verifier</th></tr>"
    ]
    for name, r in result["domains"].items():
        t, a = r.get("train_accuracy"), r.get("accuracy")
        if t is None or a is None:
            continue
        cls = "alarm" if t - a > 0.02 else ""
        rows.append(
            f'<tr><td class="l">{_e(name)}</td><td>{t:.3f}</td><td>{a:.3f}</td><td class="{cls}">{t - a:+.3f}</td>'
            f'<td class="l">{_e(r.get("eval_verifier", ""))}</td></tr>'
        )
    return "<table>" + "".join(rows) + "</table>"


def sampling_table(result: Mapping[str, Any]) -> str:
    sampled = {k: r["sampling"] for k, r in result["domains"].items() if r.get("sampling")}
    if not sampled:
        return '<p class="empty">no sampled metrics (eval.samples=0)</p>'
    keys = sorted({m for s in sampled.values() for m in s}, key=lambda m: (m.split("@")[0], int(m.split("@")[1])))
    rows = ['<tr><th class="l">domain</th>' + "".join(f"<th>{_e(k)}</th>" for k in keys) + "</tr>"]
    for name, s in sampled.items():
        rows.append(
            f'<tr><td class="l">{_e(name)}</td>'
            + "".join(
                f'<td>{s[k][0]:.3f} <span class="meta">[{s[k][1]:.2f}, {s[k][2]:.2f}]</span></td>'
                if k in s
                else "<td></td>"
                for k in keys
            )
            + "</tr>"
        )
    return "<table>" + "".join(rows) + "</table>"


def _by_turn(result: Mapping[str, Any] | None) -> dict[str, list[tuple[int, float, float, float]]]:
    """Multi-turn domains of one eval.json side -> [(k, pass@turn-k, low, high)]."""
    out = {}
    for name, r in ((result or {}).get("domains") or {}).items():
        if r.get("pass_at_turn"):
            out[name] = [(int(k), *v) for k, v in sorted(r["pass_at_turn"].items(), key=lambda kv: int(kv[0]))]
    return out


def _converted(result: Mapping[str, Any] | None) -> dict[str, str]:
    """Multi-turn domains of one eval.json side -> the share converted at each turn k >= 2, as a
    cell ("" for an eval.json written before `turn_gain`)."""
    out = {}
    for name, r in ((result or {}).get("domains") or {}).items():
        gain = sorted((r.get("turn_gain") or {}).items(), key=lambda kv: int(kv[0]))
        out[name] = "; ".join(
            f'turn-{k} +{v:.3f} <span class="meta">[{lo:.2f}, {hi:.2f}] {int(c)} of {r.get("scored", "?")}</span>'
            for k, (v, lo, hi, c) in gain
        )
    return out


def turns_table(table: Mapping[str, Any], labels: tuple[str, str] = ("before", "after")) -> str:
    """pass@turn-k of each multi-turn domain, both sides, and the share of items a later turn
    converted (pass@turn-k minus pass@turn-(k-1)); empty when no domain is multi-turn."""
    sides = [(labels[0], _by_turn(table.get("before"))), (labels[1], _by_turn(table.get("after")))]
    converted = {labels[0]: _converted(table.get("before")), labels[1]: _converted(table.get("after"))}
    names = list(sides[0][1]) + [n for n in sides[1][1] if n not in sides[0][1]]
    if not names:
        return ""
    width = max(len(pts) for _, side in sides for pts in side.values())
    rows = [
        '<tr><th class="l">domain</th><th class="l">model</th>'
        + "".join(f"<th>pass@turn-{k}</th>" for k in range(1, width + 1))
        + '<th class="l">converted at turn k</th></tr>'
    ]
    for name in names:
        for label, side in sides:
            if name in side:
                rows.append(
                    f'<tr><td class="l">{_e(name)}</td><td class="l">{_e(label)}</td>'
                    + "".join(
                        f'<td>{v:.3f} <span class="meta">[{lo:.2f}, {hi:.2f}]</span></td>'
                        for _, v, lo, hi in side[name]
                    )
                    + "<td></td>" * (width - len(side[name]))
                    + f'<td class="l">{converted[label].get(name, "")}</td></tr>'
                )
    note = (
        '<p class="meta">multi-turn domains are evaluated as episodes, as they are trained; pass@turn-k: '
        "share of scored items whose episode passed using at most k turns (95% Wilson intervals); converted "
        "at turn k: pass@turn-k minus pass@turn-(k-1), the items whose turn k-1 failed and turn k passed, with "
        "the interval of that difference (a proportion of the same items).</p>"
    )
    return "<h3>Pass rate by turn</h3><table>" + "".join(rows) + "</table>" + note


def turns_plot(data: RunData) -> str | None:
    """pass@turn-k against k for each multi-turn domain, before and after training, with 95% bands."""
    table = data.eval_table or {}
    before, after = _by_turn(table.get("before")), _by_turn(table.get("after"))
    if not before and not after:
        return None
    import matplotlib.pyplot as plt

    from posttrain.report.html import _png

    fig, ax = plt.subplots(figsize=(5.2, 3.0))
    for i, name in enumerate(sorted(set(before) | set(after))):
        for side, style in ((before, "--"), (after, "-")):
            if name in side:
                ks, ys, lo, hi = zip(*side[name])
                label = f"{name} ({'before' if side is before else 'after'})"
                ax.plot(ks, ys, style, marker="o", markersize=3, color=f"C{i % 10}", label=label)
                ax.fill_between(ks, lo, hi, color=f"C{i % 10}", alpha=0.1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("turns allowed (k)", fontsize=9)
    ax.set_ylabel("pass@turn-k", fontsize=9)
    ax.set_title("multi-turn domains: pass rate by turn", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


def probes_table(table: Mapping[str, Any]) -> str:
    before, after = table["before"].get("probes", {}), (table.get("after") or {}).get("probes", {})
    if not before:
        return '<p class="empty">no generalisation probes (eval.above_tasks=0 and no eval.transfer_domains)</p>'
    deltas = (table.get("deltas") or {}).get("probes", {})
    rows = [
        '<tr><th class="l">probe</th><th class="l">domain</th><th>level</th><th>n</th><th>before</th><th>after</th>'
        "<th>delta [paired 95% CI]</th></tr>"
    ]
    for key, b in before.items():
        kind = "level above trained" if key.startswith("above:") else "transfer (never trained)"
        rows.append(
            f'<tr><td class="l">{kind}</td><td '
            f'class="l">{_e(b["domain"])}</td><td>{b["difficulty"]}</td><td>{_n(b)}</td>'
            f"{_acc(b)}{_acc(after.get(key))}{_delta(deltas.get(key))}</tr>"
        )
    return "<table>" + "".join(rows) + "</table>"


def checks_tables(table: Mapping[str, Any]) -> str:
    parts = []
    cont = table.get("contamination")
    if cont:
        rows = [
            '<tr><th class="l">held-out set</th><th>n-gram</th><th>held-out</th><th>train draws</th><th>exact '
            "overlap</th>"
            "<th>contaminated</th><th>max overlap</th></tr>"
        ]
        for key, c in cont.items():
            cls = "alarm" if c["contaminated"] or c["exact_overlap"] else ""
            rows.append(
                "<tr><td "
                f'class="l">{_e(key)}</td><td>{c["n"]}</td><td>{c["eval_tasks"]}</td><td>{c["train_tasks"]}</td>'
                f'<td class="{cls}">{c["exact_overlap"]}</td><td '
                f'class="{cls}">{c["contaminated"]}</td><td>{c["max_overlap"]:.2f}</td></tr>'
            )
        parts.append(
            "<h3>n-gram overlap of held-out prompts with training draws</h3><table>" + "".join(rows) + "</table>"
        )
    exp = table.get("exposure")
    if exp:
        rows = [
            '<tr><th class="l">domain</th><th>items</th><th>held-out margin</th><th>control margin</th><th>gap [95% '
            'CI]</th><th class="l">verdict</th></tr>'
        ]
        for name, e in exp.items():
            verdict = '<span class="alarm">looks memorised</span>' if e["flagged"] else "no sign of exposure"
            rows.append(
                "<tr><td "
                f'class="l">{_e(name)}</td><td>{e["n"]}</td><td>{e["heldout_margin"]:+.2f}</td><td>{e["control_margin"]:+.2f}</td>'
                f'<td>{e["gap"]:+.2f} <span class="meta">[{e["low"]:+.2f}, {e["high"]:+.2f}]</span></td><td '
                f'class="l">{verdict}</td></tr>'
            )
        parts.append(
            "<h3>Exposure of the base model (log-likelihood of gold over wrong answers, held-out vs "
            "control)</h3><table>" + "".join(rows) + "</table>"
        )
    warnings = (table.get("heldout") or {}).get("warnings") or []
    if warnings:
        parts.append("<ul>" + "".join(f'<li class="alarm">{_e(w)}</li>' for w in warnings) + "</ul>")
    hv = table.get("heldout") or {}
    if hv:
        parts.append(
            f'<p class="meta">held-out set version {_e(hv.get("version", "?"))}, seed {_e(hv.get("seed", 0))}, '
            f"{sum(len(s['indices']) for s in hv.get('sets', {}).values())} items; stored in heldout.json</p>"
        )
    return "".join(parts) or '<p class="empty">no contamination or exposure checks in this run</p>'


def eval_section(data: RunData) -> str:
    table = data.eval_table
    if not table or not table.get("before"):
        return '<p class="empty">no eval.json</p>'
    if "deltas" not in table:  # an older eval.json: accuracies only
        return before_after_table({**table, "deltas": {}})
    last = table.get("after") or table["before"]
    return (
        before_after_table(table)
        + turns_table(table)
        + "<h3>Training verifier vs eval verifier (after)</h3>"
        + verifier_table(last)
        + "<h3>Sampled metrics (after)</h3>"
        + sampling_table(last)
        + "<h3>Generalisation probes</h3>"
        + probes_table(table)
        + "<h2>Contamination checks</h2>"
        + checks_tables(table)
    )


# ---------------------------------------------------------------- plots


def heldout_curves(data: RunData) -> str | None:
    """Held-out accuracy of the fixed subset at every evaluation, a 95% band per domain."""
    series = data.heldout_intervals()
    if not series:
        return None
    import matplotlib.pyplot as plt

    from posttrain.report.html import _png

    fig, axes = plt.subplots(1, 2, figsize=(10.4, 3.2), squeeze=False)
    ax, rot = axes[0]
    for i, (name, pts) in enumerate(sorted(series.items(), key=lambda kv: kv[0] == "mean over domains")):
        xs, ys, lo, hi = zip(*pts)
        colour = "black" if name == "mean over domains" else f"C{i % 10}"
        ax.plot(xs, ys, marker="o", markersize=3, color=colour, label=name, linewidth=2 if colour == "black" else 1.3)
        ax.fill_between(xs, lo, hi, color=colour, alpha=0.12)
    ax.set_ylim(0, 1)
    ax.set_title("fixed held-out subset: accuracy with 95% intervals", fontsize=10)
    ax.set_xlabel("step", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    for i, (name, pts) in enumerate(sorted(data.rotation_by_domain().items())):
        xs, ys = zip(*pts)
        rot.plot(xs, ys, marker="o", markersize=3, color=f"C{i % 10}", label=name)
    rot.set_ylim(0, 1)
    rot.set_title("rotation slices (fresh items each evaluation)", fontsize=10)
    rot.set_xlabel("step", fontsize=9)
    rot.grid(alpha=0.3)
    if data.rotation_by_domain():
        rot.legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


def delta_bars(names: list[str], deltas: Mapping[str, Mapping[str, Any]], title: str) -> Any:
    """A matplotlib figure: per-domain delta with its paired interval; significant bars coloured."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(5.2, 0.9 * len(names) + 2), 3.0))
    for i, name in enumerate(names):
        d = deltas.get(name)
        if not d or not d.get("n"):
            continue
        colour = ("#1a7f37" if d["delta"] > 0 else "#cf222e") if d["significant"] else "#8a949e"
        ax.bar(i, d["delta"], color=colour, width=0.6)
        ax.errorbar(
            i, d["delta"], yerr=[[d["delta"] - d["ci"][0]], [d["ci"][1] - d["delta"]]], color="black", capsize=4
        )
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(names)), names, fontsize=8, rotation=30 if len(names) > 6 else 0)
    ax.set_ylabel("accuracy delta", fontsize=9)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def heldout_bars(data: RunData) -> str | None:
    table = data.eval_table
    if not table or not table.get("after") or "deltas" not in table:
        return None
    from posttrain.report.html import _png

    deltas = table["deltas"]["domains"]
    return _png(
        delta_bars(
            list(table["before"]["domains"]),
            deltas,
            "after - before per domain, paired 95% intervals (coloured: significant)",
        )
    )
