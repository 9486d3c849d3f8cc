"""`write_report(run_dir, ...)`: one self-contained HTML page with embedded PNG plots, of one
run or of several overlaid (`live.py` rewrites it while a run trains).

Invariant: the page references nothing outside itself (plots are base64
data URIs, styles inline, no scripts), every text taken from the run is
HTML-escaped, and a section without data says so instead of failing. A page
is written to a temporary file in its folder and renamed over the old one,
so a reader (a browser refreshing during training) sees the old page or the
new one, never half of one.
"""

from __future__ import annotations

import base64
import html
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posttrain.report import dashboard
from posttrain.report.data import RunData, Series, load_run
from posttrain.report.evalhtml import eval_section, heldout_bars, heldout_curves, turns_plot

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1180px;color:#1d2329;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h3{font-size:14px;margin:16px 0 6px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde2e7;padding-bottom:4px}
.meta{color:#5b6670}.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:12px}
figure.wide{grid-column:1/-1}figure{margin:0;border:1px solid #e3e7eb;border-radius:6px;padding:6px;background:#fff}figure img{width:100%;height:auto}
figcaption{color:#5b6670;font-size:12px;padding:2px 4px}table{border-collapse:collapse;margin:6px 0}
td,th{border:1px solid #dde2e7;padding:3px 8px;text-align:right}th{background:#f3f5f7}td.l,th.l{text-align:left}
.pos{color:#1a7f37}.neg{color:#cf222e}.alarm{color:#cf222e;font-weight:600}.empty{color:#8a949e;font-style:italic}
pre{background:#f6f8fa;padding:8px;border-radius:6px;overflow:auto;font-size:12px;max-height:260px}
"""


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _smooth(ys: Sequence[float], k: int) -> list[float]:
    """Trailing running mean over k points (the first points average what exists)."""
    out, total = [], 0.0
    for i, y in enumerate(ys):
        total += y - (ys[i - k] if i >= k else 0.0)
        out.append(total / min(i + 1, k))
    return out


def _figure(
    title: str, panels: Sequence[tuple[str, Series]], ylabel: Sequence[str] = (), alarms: Sequence[dict] = ()
) -> str | None:
    """One row of line panels (one line per key of each series); None when all are empty."""
    if not any(series for _, series in panels):
        return None
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.0), squeeze=False)
    for i, (ax, (name, series)) in enumerate(zip(axes[0], panels)):
        for n, (key, points) in enumerate(sorted(series.items())):
            if points:
                xs, ys = zip(*points)
                colour = f"C{n % 10}"
                if len(xs) >= 30:  # noisy per-step values: faint raw line, bold running mean
                    ax.plot(xs, ys, color=colour, linewidth=0.6, alpha=0.25)
                    ys = _smooth(ys, max(3, len(xs) // 25))
                ax.plot(
                    xs, ys, label=key, color=colour, linewidth=1.5, marker="o" if len(xs) < 12 else None, markersize=3
                )
        for a in alarms:
            ax.axvline(a["step"], color="#cf222e", alpha=0.25, linewidth=1)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("step", fontsize=9)
        if i < len(ylabel):
            ax.set_ylabel(ylabel[i], fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
        if any(series.values()):
            ax.legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return _png(fig)


def _heldout_bars(data: RunData) -> str | None:
    table = data.eval_table
    if not table or not table.get("before"):
        return None
    import matplotlib.pyplot as plt
    import numpy as np

    # a domain whose every item hit an infra error has no accuracy (None): no bar and a
    # "no score" mark, never a bar at 0.0
    before = {d: v["accuracy"] for d, v in table["before"]["domains"].items()}
    after = {d: v["accuracy"] for d, v in (table.get("after") or {}).get("domains", {}).items()}
    names = sorted(before)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(5.2, 1.1 * len(names) + 2), 3.0))
    sides = [(-0.2, before, "before", "#8a949e")] + ([(0.2, after, "after", "#2f81f7")] if after else [])
    for dx, acc, label, color in sides:
        values = [acc.get(n) for n in names]
        ax.bar(x + dx, [np.nan if v is None else v for v in values], 0.4, label=label, color=color)
        for xi, v in zip(x, values):
            if v is None:
                ax.text(xi + dx, 0.02, "no score", rotation=90, ha="center", va="bottom", fontsize=6, color="#b42318")
    ax.set_xticks(x, names, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("held-out accuracy", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_title("held-out accuracy before and after", fontsize=10)
    fig.tight_layout()
    return _png(fig)


def _alarm_timeline(data: RunData) -> str | None:
    if not data.alarms:
        return None
    import matplotlib.pyplot as plt

    kinds = sorted({a["alarm"] for a in data.alarms})
    domains = sorted({str(a.get("domain")) for a in data.alarms})
    colours = plt.get_cmap("tab10")
    last = max([r["step"] for r in data.train] + [a["step"] for a in data.alarms] + [1])
    fig, ax = plt.subplots(figsize=(12.0, 1.2 + 0.5 * len(kinds)))
    for a in data.alarms:
        ax.scatter(
            a["step"], kinds.index(a["alarm"]), color=colours(domains.index(str(a.get("domain"))) % 10), s=60, zorder=3
        )
    for i, d in enumerate(domains):
        ax.scatter([], [], color=colours(i % 10), label=d)
    ax.set_yticks(range(len(kinds)), kinds, fontsize=8)
    ax.set_xlim(-1, last + 1)
    ax.set_xlabel("step", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="domain", title_fontsize=7)
    ax.set_title("alarms", fontsize=10)
    fig.tight_layout()
    return _png(fig)


def _sandbox_bars(data: RunData) -> str | None:
    if not data.sandbox:
        return None
    import matplotlib.pyplot as plt
    import numpy as np

    outcomes = sorted({k for c in data.sandbox.values() for k in c})
    domains = sorted(data.sandbox)
    fig, ax = plt.subplots(figsize=(10.4, 3.0))
    bottom = np.zeros(len(domains))
    for outcome in outcomes:
        counts = np.array([data.sandbox[d].get(outcome, 0) for d in domains], dtype=float)
        ax.bar(domains, counts, bottom=bottom, label=outcome)
        bottom += counts
    ax.set_ylabel("rollouts", fontsize=9)
    ax.legend(fontsize=7)
    ax.set_title("sandbox outcomes and infra errors by domain", fontsize=10)
    fig.tight_layout()
    return _png(fig)


# ---------------------------------------------------------------- HTML pieces


def _present(series: Series) -> Series:
    """The lines of `series` that have points (a run logged before a figure existed draws none)."""
    return {key: points for key, points in series.items() if points}


def _img(src: str | None, caption: str, wide: bool = False) -> str:
    cls = ' class="wide"' if wide else ""
    if src is None:
        return f'<figure{cls}><p class="empty">{html.escape(caption)}: no data in this run</p></figure>'
    return (
        f'<figure{cls}><img src="{src}" '
        f'alt="{html.escape(caption)}"><figcaption>{html.escape(caption)}</figcaption></figure>'
    )


def _alarm_table(data: RunData) -> str:
    if not data.alarms:
        return '<p class="empty">no alarm fired</p>'
    rows = [
        '<tr><th>step</th><th class="l">alarm</th><th class="l">domain</th><th class="l">message</th><th '
        'class="l">action</th></tr>'
    ]
    for a in data.alarms:
        rows.append(
            f'<tr><td>{a["step"]}</td><td class="l alarm">{html.escape(a["alarm"])}</td>'
            f'<td class="l">{html.escape(str(a.get("domain") or "-"))}</td><td '
            f'class="l">{html.escape(a["message"])}</td>'
            f'<td class="l">{html.escape(str(a.get("done") or a.get("action")))}</td></tr>'
        )
    return "<table>" + "".join(rows) + "</table>"


def _probe_table(data: RunData) -> str:
    """One row per domain: how often its verifier was probed and whether it ever accepted a cheat."""
    if not data.probes:
        return '<p class="empty">no probes ran</p>'
    by_domain: dict[str, list[dict]] = {}
    for p in data.probes:
        by_domain.setdefault(p["domain"], []).append(p)
    rows = [
        '<tr><th class="l">domain</th><th class="l">verifier</th><th>probes</th><th>cheats scored</th>'
        '<th>accepted</th><th class="l">steps probed</th><th class="l">verdict</th></tr>'
    ]
    for name, probes in sorted(by_domain.items()):
        declared = any(p.get("declared") for p in probes)
        failed = [p for p in probes if p.get("declared") and not p.get("ok")]
        verdict = (
            "no cheats declared"
            if not declared
            else (f"ACCEPTS CHEATS at step {failed[0]['step']}: refused" if failed else "sound")
        )
        steps = ", ".join(str(p["step"]) for p in probes)
        rows.append(
            f'<tr><td class="l">{html.escape(name)}</td><td '
            f'class="l">{html.escape(str(probes[-1].get("verifier", "-")))}</td>'
            f"<td>{len(probes)}</td><td>{sum(p.get('cheats', 0) for p in probes)}</td>"
            f'<td>{sum(p.get("accepted", 0) for p in probes)}</td><td class="l">{html.escape(steps)}</td>'
            f'<td class="l{" alarm" if failed else ""}">{verdict}</td></tr>'
        )
    return "<table>" + "".join(rows) + "</table>"


def _judge_table(data: RunData) -> str:
    """One row per judge domain: its run-start bias figures and the checks that fired."""
    if not data.judges:
        return '<p class="empty">no judge domain declares bias checks</p>'

    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f}"

    rows = [
        '<tr><th class="l">domain</th><th class="l">judge</th><th>items</th><th>agreement [95% CI]</th>'
        "<th>length bias</th><th>swap disagreement</th><th>content bias (worst)</th><th>abstentions (skew)</th>"
        '<th class="l">verdict</th></tr>'
    ]
    for j in data.judges:
        fired = j.get("fired") or []
        rows.append(
            f'<tr><td class="l">{html.escape(str(j["domain"]))}</td><td class="l">{html.escape(str(j["verifier"]))}</td>'
            f"<td>{j['items'] - j['infra_errors']}</td>"
            f"<td>{fmt(j['agreement'])} [{j['agreement_low']:.2f}, {j['agreement_high']:.2f}]</td>"
            f"<td>{fmt(j['length_bias'])}</td><td>{fmt(j['swap_disagreement'])}</td>"
            f"<td>{fmt(max((j.get('content_bias') or {}).values(), default=None))}</td>"
            f"<td>{j.get('abstentions', 0)} ({fmt(j.get('abstention_skew'))})</td>"
            f'<td class="l{" alarm" if fired else ""}">{html.escape("biased: " + ", ".join(fired) if fired else "passed")}</td></tr>'
        )
    return "<table>" + "".join(rows) + "</table>"


def _token_table(data: RunData) -> str:
    """Per domain: token budget per turn, mean completion tokens, share truncated at the budget."""
    use = data.token_use()
    if not use:
        return '<p class="empty">no per-domain token figures in this run</p>'
    rows = ['<tr><th class="l">domain</th><th>budget (tokens)</th><th>mean tokens</th><th>truncated share</th></tr>']
    for name, u in use.items():
        budget = f"{u['token_budget']:.0f}" if "token_budget" in u else "-"
        rows.append(
            f'<tr><td class="l">{html.escape(name)}</td><td>{budget}</td><td>{u.get("tokens_mean", 0.0):.1f}</td>'
            f"<td>{u.get('truncated_share', 0.0):.1%}</td></tr>"
        )
    return "<table>" + "".join(rows) + "</table>"


def _staleness_table(data: RunData) -> str:
    """pipeline.mode async: groups re-queued and dropped for staleness, by domain and length bucket."""
    stale = data.staleness()
    if stale is None:
        return '<p class="empty">pipeline.mode sync: on-policy, nothing is stale</p>'
    most = stale.pop("max")["staleness"]
    head = f"<p>largest staleness trained on: {most:.0f} weight versions</p>"
    if not stale:
        return head + '<p class="empty">no group was re-queued or dropped for staleness</p>'
    rows = ['<tr><th class="l">by</th><th class="l">value</th><th>re-queued</th><th>dropped</th></tr>']
    for key, c in sorted(stale.items()):
        by, name = key.split(":", 1)
        label = "domain" if by == "domain" else "completion tokens"
        rows.append(
            f'<tr><td class="l">{label}</td><td class="l">{html.escape(name)}</td>'
            f"<td>{c.get('requeued', 0):.0f}</td><td>{c.get('dropped', 0):.0f}</td></tr>"
        )
    return head + "<table>" + "".join(rows) + "</table>"


def _pool_table(data: RunData) -> str:
    """runtime ray: each stage's actors, at the first step and wherever the elastic controller moved them."""
    rows = data.pools()
    if not rows:
        return '<p class="empty">no Ray stage pools in this run (runtime embedded)</p>'
    head = (
        "<tr><th>step</th><th>generate</th><th>execute</th><th>verify</th>"
        "<th>changes</th><th>grown</th><th>shrunk</th><th>blocked (no room)</th></tr>"
    )
    cols = ("generate_workers", "execute_workers", "verify_workers", "changes", "grown", "shrunk", "blocked")
    body = "".join(
        f"<tr><td>{r['step']:.0f}</td>" + "".join(f"<td>{r.get('pool_' + c, 0.0):.0f}</td>" for c in cols) + "</tr>"
        for r in rows
    )
    return f"<table>{head}{body}</table>"


def _replay_table(data: RunData) -> str:
    """trainer.replay: how much of the training was replayed, how old it was, how off-policy."""
    r = data.replay()
    if r is None:
        return '<p class="empty">trainer.replay off: every step trains only on what it sampled</p>'
    cells = [
        ("steps that replayed", f"{r['steps']:.0f}"),
        ("groups replayed / admitted", f"{r['groups']:.0f} / {r['admitted']:.0f}"),
        ("share of a replaying step's rows", f"{r['share']:.1%}"),
        ("age, mean / max (weight versions)", f"{r['age_mean']:.2f} / {r['age_max']:.0f}"),
        ("ratio to behaviour log-probs, mean", f"{r['ratio_mean']:.4f}"),
        ("clipped share of replayed tokens", f"{r['clipped']:.1%}"),
        (
            "evicted: age / capacity / used up",
            f"{r['evicted_age']:.0f} / {r['evicted_capacity']:.0f} / {r['evicted_used']:.0f}",
        ),
    ]
    rows = "".join(f'<tr><td class="l">{html.escape(k)}</td><td>{v}</td></tr>' for k, v in cells)
    return f"<table>{rows}</table>"


def _history_table(data: RunData) -> str:
    """The run's config history (lineage.py): each resume that changed fields, a branch's source."""
    from posttrain.lineage import describe, read_history

    entries = read_history(data.path)
    if not entries:
        return '<p class="empty">neither extended nor branched: one config from step 0</p>'
    rows = "".join(
        f'<tr><td>{e.get("step", 0):.0f}</td><td class="l">{html.escape(describe(e))}</td></tr>' for e in entries
    )
    return f'<table><tr><th>step</th><th class="l">change</th></tr>{rows}</table>'


def _summary(data: RunData) -> str:
    steps = data.train[-1]["step"] if data.train else 0
    overhead = [r.get("monitor_s", 0.0) for r in data.monitor]
    step_s = [r.get("rollout_s", 0.0) + r.get("seconds", 0.0) for r in data.train]
    parts = [f"{steps} steps", f"{len(data.alarms)} alarms"]
    if overhead and step_s:
        parts.append(
            f"monitor overhead {1000 * sum(overhead) / len(overhead):.1f} ms/step "
            f"(rollout+train {1000 * sum(step_s) / len(step_s):.0f} ms/step)"
        )
    return " · ".join(parts)


_WIDE = {0, 3, 4, 5, 6, 7, 8, 11, 12}  # multi-panel figures and the alarm timeline span the page


def render(data: RunData) -> str:
    alarms = data.alarms
    sig = data.per_domain
    figures = [
        (
            _figure(
                "reward and pass rate per domain",
                [("train reward", data.reward_by_domain()), ("pass rate", sig("pass_rate"))],
                alarms=alarms,
            ),
            "training reward (mean) and pass rate of each domain's rollouts; red lines mark alarms",
        ),
        (
            heldout_bars(data) or _heldout_bars(data),
            "held-out accuracy before and after training: the change per domain with paired 95% intervals",
        ),
        (
            heldout_curves(data)
            or _figure(
                "held-out accuracy over training", [("held-out accuracy (eval table)", data.heldout_by_domain())]
            ),
            "held-out accuracy of the fixed subset at each evaluation with 95% Wilson bands; rotation slices apart",
        ),
        (
            _figure(
                "policy entropy",
                [
                    ("token entropy (sampled tokens)", sig("entropy")),
                    ("trainer entropy (full distribution)", {"all": data.train_series("entropy")}),
                ],
                alarms=alarms,
            ),
            "mean negative log-prob of sampled tokens per domain; the trainer's exact entropy over trained rows",
        ),
        (
            _figure(
                "within-group diversity",
                [
                    ("distinct answers / group", sig("distinct_answers")),
                    ("distinct-2", sig("distinct_n")),
                    ("pairwise edit distance", sig("edit_distance")),
                ],
                alarms=alarms,
            ),
            "diversity of the G samples of one prompt",
        ),
        (
            _figure(
                "KL and length",
                [("KL to the initial model", data.kl()), ("response length (tokens)", sig("length_mean"))],
                alarms=alarms,
            ),
            "KL (k3 estimate on sampled tokens) and mean completion length",
        ),
        (
            _figure(
                "optimisation",
                [
                    ("advantage std", sig("adv_std")),
                    ("clip fraction", {"all": data.train_series("clip_frac")}),
                    ("filtered group share", sig("filtered_share")),
                ],
            ),
            "advantage spread, PPO clip fraction and share of groups without signal",
        ),
        (
            _figure(
                "infra errors and truncation",
                [("infra-error rate", sig("infra_error_rate")), ("truncated share", sig("truncated_share"))],
            ),
            "infra errors are masked from the loss, never scored 0",
        ),
        (
            _figure(
                "sampling mix and audits",
                [
                    ("target sampling share", data.shares()),
                    ("audit: share of top-reward rollouts failing the stricter check", data.audit_fail_share()),
                ],
                alarms=alarms,
            ),
            "the pool's target share per domain (lower_weight alarms and refused domains change it); stricter-check "
            "audit",
        ),
        (
            _figure("pipeline stage utilisation", [("busy share", data.stage_utilisation())]),
            "pipeline stage utilisation",
        ),
        (_sandbox_bars(data), "sandbox outcome counts"),
        (_alarm_timeline(data), "alarms on a timeline"),
        (
            _figure(
                "train-inference mismatch and verified sync",
                [
                    (
                        "|logp trainer - logp behaviour|",
                        _present(
                            {
                                "mean": data.train_series("mismatch_abs_mean"),
                                "max": data.train_series("mismatch_abs_max"),
                            }
                        ),
                    ),
                    (
                        "k3 KL and token shares",
                        _present(
                            {
                                "k3 KL(behaviour || trainer)": data.train_series("mismatch_k3"),
                                "share outside the ratio bound": data.train_series("mismatch_outside"),
                                "share corrected": data.train_series("mismatch_corrected"),
                            }
                        ),
                    ),
                    (
                        "sync probe max |engine - trainer|",
                        _present({"probe": data.train_series("sync_probe_max_diff")}),
                    ),
                ],
            ),
            "the engine's behaviour log-probs against the trainer's own of the same tokens before each update "
            "(trainer.mismatch), and the check after each weight push (engine.verify_sync)",
        ),
    ]
    wide = set(_WIDE)
    depths, domains, head = data.speculation()
    step_len = data.spec_step_len()
    if depths or domains or head:  # only runs with engine.speculation or trainer.draft_head
        panels = [
            ("draft acceptance at each depth (rollouts)", depths),
            ("draft acceptance per domain (rollouts)", domains),
            ("draft head accuracy at each depth (its fit, teacher-forced)", head),
            ("tokens per row per drafting step", step_len),
        ]
        panels = [p for p in panels if p[1]]  # a head trained beside rollouts that do not draft: its panel alone
        if len(panels) > 1:
            wide.add(len(figures))
        figures.append(
            (
                _figure("speculative decoding", panels),
                "engine.speculation: the share of drafts reaching each depth whose token there was accepted, the "
                "mean tokens emitted per verified draft (over 10), each domain's acceptance; trainer.draft_head: "
                "the head's argmax against the policy's sampled token at each depth before its update; tokens "
                "per row per drafting step in the rollouts and at the probe after each push (greedy, fixed "
                "prompts), whose fall stops the run (engine.speculation.collapse_check)",
            )
        )
    turns = turns_plot(data)
    if turns is not None:  # only runs with a multi-turn domain
        figures.append(
            (
                turns,
                "multi-turn domains, evaluated as episodes: pass rate within k turns, before (dashed) "
                "and after training",
            )
        )
    body = "".join(_img(src, cap, wide=i in wide) for i, (src, cap) in enumerate(figures))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>posttrain report: {html.escape(data.path.name)}</title>
<style>{_CSS}{dashboard.CSS}</style></head><body>
<h1>posttrain run report: {html.escape(data.path.name)}</h1>
<p class="meta">{html.escape(str(data.path))} · {html.escape(_summary(data))}</p>
{dashboard.problems_note([data])}
<h2 id="dynamics">Training dynamics</h2>{dashboard.dynamics_section([data])}
<h2 id="samples">Sample completions at each evaluation</h2>{dashboard.samples_section(data)}
<h2>Held-out accuracy</h2>{eval_section(data)}
<h2>Alarms</h2>{_alarm_table(data)}
<h2>Reward-hacking probes</h2>{_probe_table(data)}
<h2>Judge bias checks</h2>{_judge_table(data)}
<h2>Token use per domain</h2>{_token_table(data)}
<h2>Staleness (pipeline.mode async)</h2>{_staleness_table(data)}
<h2>Replay (trainer.replay)</h2>{_replay_table(data)}
<h2>Stage pools (runtime ray, pipeline.elastic)</h2>{_pool_table(data)}
<h2>Curves</h2><div class="grid">{body}</div>
<h2>Run history (resumes with changes, branches)</h2>{_history_table(data)}
<h2>Config</h2><pre>{html.escape(data.config)}</pre>
</body></html>
"""


def render_runs(runs: Sequence[RunData]) -> str:
    """Several runs on one page: each dashboard curve and the held-out accuracy with one line per
    run, a row per run, and each run's newest evaluation samples."""
    names = dashboard.labels(runs)
    rows = "".join(
        f'<tr><td class="l">{html.escape(name)}</td><td class="l">{html.escape(str(run.path))}</td>'
        f'<td class="l">{html.escape(_summary(run))}</td></tr>'
        for name, run in zip(names, runs)
    )
    samples = "".join(f"<h3>{html.escape(name)}</h3>{dashboard.samples_section(run)}" for name, run in zip(names, runs))
    title = " vs ".join(names)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>posttrain report: {html.escape(title)}</title>
<style>{_CSS}{dashboard.CSS}</style></head><body>
<h1>posttrain runs: {html.escape(title)}</h1>
<table><tr><th class="l">run</th><th class="l">folder</th><th class="l">summary</th></tr>{rows}</table>
{dashboard.problems_note(runs)}
<h2 id="dynamics">Training dynamics</h2>{dashboard.dynamics_section(runs, dashboard.heldout_overlay(runs))}
<h2 id="samples">Sample completions at each evaluation</h2>{samples}
</body></html>
"""


def _write_atomic(path: Path, text: str) -> None:
    """`text` to `path` through a temporary file in the same folder and a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_report(run_dir: str | Path, out: str | Path | None = None, others: Sequence[str | Path] = ()) -> Path:
    """Render RUN_DIR/report.html (or `out`) and return its path. With `others` (more run
    directories), one page overlays them all, by default RUN_DIR/overlay.html."""
    data = load_run(run_dir)
    runs = [data, *(load_run(o) for o in others)]  # every folder checked before any plotting
    import matplotlib

    matplotlib.use("Agg", force=True)
    if others:
        path = Path(out) if out else data.path / "overlay.html"
        _write_atomic(path, render_runs(runs))
        return path
    path = Path(out) if out else data.path / "report.html"
    _write_atomic(path, render(data))
    return path
