"""The practitioner's dashboard of a report: training-dynamics curves of one run or several
overlaid, and each evaluation's sample completions per domain (best, worst, most common failure).

Invariant: every curve is a key of the train rows of metrics.jsonl as the loop wrote it (or a
ratio of two of them, named in its caption); a curve a run did not log says "not logged" with
the key it looked for, never an empty or broken chart; a sample is an item of
eval_samples.jsonl as the evaluation wrote it, an image task's beside its images (drawn again
from the task id, shown only when their digests are the recorded ones: report/taskimages.py) and
its gold answer; every text from a run is HTML-escaped.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.report import taskimages
from posttrain.report.data import RunData

Points = list[tuple[int, float]]


def _key(name: str) -> Callable[[dict[str, Any]], float | None]:
    def get(row: dict[str, Any]) -> float | None:
        v = row.get(name)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    return get


def _tokens_per_s(row: dict[str, Any]) -> float | None:
    tokens, step_s = _key("tokens_sampled")(row), _step_s(row)
    return tokens / step_s if tokens is not None and step_s else None


def _step_s(row: dict[str, Any]) -> float | None:
    rollout, train = _key("rollout_s")(row), _key("seconds")(row)
    return None if rollout is None else rollout + (train or 0.0)


@dataclass(frozen=True)
class Curve:
    """One dashboard panel: a value per train row."""

    title: str
    keys: str
    """The metrics keys it reads (what a "not logged" note names)."""
    value: Callable[[dict[str, Any]], float | None]
    caption: str
    log_y: bool = False
    points: Callable[[RunData], Points] | None = None
    """Where the points come from when not one value per train row (`value` is then unused)."""


CURVES = (
    Curve("loss", "loss", _key("loss"), "the policy loss of each step (its value, not a quality measure)"),
    Curve("gradient norm", "grad_norm", _key("grad_norm"), "gradient norm before clipping", log_y=True),
    Curve("learning rate", "lr", _key("lr"), "the optimizer's learning rate after the schedule"),
    Curve(
        "KL to the reference",
        "kl (train rows), kl (monitor rows)",
        _key("kl"),
        "the trainer's k3 KL to the reference where the loss has a KL term; else the monitor's KL to the "
        "initial model, mean over domains, every monitor.kl.every_steps",
        points=lambda data: _kl_points(data),
    ),
    Curve("entropy", "entropy", _key("entropy"), "the policy's token entropy over the trained rows (nats)"),
    Curve("clip fraction", "clip_frac", _key("clip_frac"), "share of loss tokens whose ratio the loss clipped"),
    Curve(
        "tokens/s",
        "tokens_sampled, rollout_s, seconds",
        _tokens_per_s,
        "completion tokens sampled per second of step (rollout + train)",
    ),
    Curve("step time (s)", "rollout_s, seconds", _step_s, "seconds per step: rollout (sample and verify) + train"),
    Curve("reward", "reward_mean", _key("reward_mean"), "mean training reward of the step's rollouts"),
    Curve(
        "peak RSS (MiB)",
        "peak_rss_mib",
        _key("peak_rss_mib"),
        "the training process's peak resident memory so far (Linux VmHWM), after each step",
    ),
)


def _kl_points(data: RunData) -> Points:
    """The trainer's KL where any is nonzero (its loss has a KL term), else the monitor's."""
    trainer = [(int(r["step"]), v) for r in data.train if (v := _key("kl")(r)) is not None]
    if any(v for _, v in trainer):
        return trainer
    monitor = [(int(r["step"]), list(r["kl"].values())) for r in data.monitor if isinstance(r.get("kl"), dict)]
    return [(step, sum(map(float, vs)) / len(vs)) for step, vs in monitor if vs] or trainer


def series(data: RunData, curve: Curve) -> Points:
    """(step, value) of every train row that logged the curve (or the curve's own `points`)."""
    if curve.points is not None:
        return curve.points(data)
    out = []
    for row in data.train:
        v = curve.value(row)
        if v is not None:
            out.append((int(row["step"]), v))
    return out


def labels(runs: Sequence[RunData]) -> list[str]:
    """A short distinct name per run: its folder name, with its parent where two share one."""
    names = [r.path.name for r in runs]
    return [f"{r.path.parent.name}/{r.path.name}" if names.count(r.path.name) > 1 else r.path.name for r in runs]


def _panel(curve: Curve, lines: dict[str, Points]) -> str:
    """One curve as a PNG data URI, one line per run."""
    import matplotlib.pyplot as plt

    from posttrain.report.html import _png, _smooth

    fig, ax = plt.subplots(figsize=(4.6, 2.8))
    for n, (name, points) in enumerate(lines.items()):
        xs, ys = zip(*points)
        colour = f"C{n % 10}"
        if len(xs) >= 30:  # noisy per-step values: faint raw line, bold running mean
            ax.plot(xs, ys, color=colour, linewidth=0.6, alpha=0.25)
            ys = tuple(_smooth(ys, max(3, len(xs) // 25)))
        ax.plot(xs, ys, label=name, color=colour, linewidth=1.5, marker="o" if len(xs) < 12 else None, markersize=3)
    if curve.log_y and all(y > 0 for points in lines.values() for _, y in points):
        ax.set_yscale("log")
    ax.set_title(curve.title, fontsize=10)
    ax.set_xlabel("step", fontsize=9)
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return _png(fig)


def curve_figure(curve: Curve, runs: Sequence[RunData]) -> str:
    """The figure of one curve over `runs`, or a "not logged" note naming the keys it reads."""
    names = labels(runs)
    lines = {name: points for name, run in zip(names, runs) if (points := series(run, curve))}
    title = html.escape(curve.title)
    if not lines:
        return (
            f'<figure class="dash"><p class="empty">{title}: not logged in '
            f"{'this run' if len(runs) == 1 else 'these runs'} (metrics key {html.escape(curve.keys)})</p></figure>"
        )
    missing = [n for n in names if n not in lines]
    note = f" · not logged in {', '.join(missing)}" if missing else ""
    return (
        f'<figure class="dash"><img src="{_panel(curve, lines)}" alt="{title}">'
        f"<figcaption>{html.escape(curve.caption + note)}</figcaption></figure>"
    )


def dynamics_section(runs: Sequence[RunData], first: str = "") -> str:
    """Every curve of `CURVES` over `runs`, one small panel each (after the figure `first`)."""
    return f'<div class="dashgrid">{first}' + "".join(curve_figure(c, runs) for c in CURVES) + "</div>"


def heldout_overlay(runs: Sequence[RunData]) -> str:
    """Mean held-out accuracy (the fixed subset) at each evaluation, one line per run."""
    curve = Curve("held-out accuracy (mean over domains)", "eval rows: mean_accuracy", _key("mean_accuracy"), "")
    lines = {}
    for name, run in zip(labels(runs), runs):
        points = [(int(r["step"]), v) for r in run.evals if (v := curve.value(r)) is not None]
        if points:
            lines[name] = points
    if not lines:
        return '<figure class="dash"><p class="empty">held-out accuracy: no evaluation logged yet</p></figure>'
    caption = "mean accuracy over domains on the fixed held-out subset, at each evaluation"
    return (
        f'<figure class="dash"><img src="{_panel(curve, lines)}" alt="held-out accuracy">'
        f"<figcaption>{caption}</figcaption></figure>"
    )


# ---------------------------------------------------------------- sample completions


def _failure(item: dict[str, Any]) -> str:
    """What a failed item did wrong, as a key to count: its error, or its first completion line."""
    if item.get("error"):
        return str(item["error"])
    text = str(item.get("completion", "")).strip().splitlines()
    return f"answered {text[0][:80]!r}" if text else "empty completion"


def pick(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The best item (highest score, a passed one first; None when none passed or scored above 0),
    the worst (lowest score, a failed one first; None when every item passed), and the most common
    failure (the failure shared by most failed items, with how many share it and the first of
    them; None when none failed)."""
    scored = [i for i in items if isinstance(i.get("value"), int | float)]
    best = max(scored, key=lambda i: (i["value"], bool(i.get("ok"))), default=None)
    worst = min(scored, key=lambda i: (i["value"], bool(i.get("ok"))), default=None)
    if best is not None and not best.get("ok") and best["value"] <= 0:
        best = None
    if worst is not None and worst.get("ok"):
        worst = None
    failed = [i for i in items if not i.get("ok")]
    common = Counter(_failure(i) for i in failed).most_common(1)
    failure = None
    if common:
        what, count = common[0]
        failure = {
            "what": what,
            "count": count,
            "failed": len(failed),
            "item": next(i for i in failed if _failure(i) == what),
        }
    return {"best": best, "worst": worst if worst is not best else None, "failure": failure}


def _cell(item: dict[str, Any] | None, head: str = "", none: str = "none") -> str:
    if item is None:
        return f'<td class="l empty">{none}</td>'
    value = item.get("value")
    verdict = "infra error" if item.get("ok") is None else ("passed" if item["ok"] else "failed")
    score = f"{value:.2f}" if isinstance(value, int | float) else "-"
    shown, gold = _images(item)
    return (
        f'<td class="l sample">{head}<div class="meta">{html.escape(str(item.get("task", "")))} · score {score} '
        f"· {verdict}</div>{shown}<code>{html.escape(str(item.get('prompt', '')))}</code> → "
        f"<code>{html.escape(str(item.get('completion', '')))}</code>{gold}</td>"
    )


def _images(item: dict[str, Any]) -> tuple[str, str]:
    """An image task's images (small inline PNGs, drawn again from the task id) and its gold
    answer, as HTML; ("", "") for a text item. An image that cannot be drawn again as recorded
    is named, not shown."""
    digests = item.get("images")
    if not isinstance(digests, list) or not digests:
        return "", ""
    task = str(item.get("task", ""))
    got = taskimages.draw(task, digests)
    gold = f'<div class="meta">gold <code>{html.escape(got.gold)}</code></div>' if got.gold else ""
    if got.problem:
        return f'<div class="meta empty">no image shown: {html.escape(got.problem)}</div>', gold
    imgs = "".join(
        f'<img class="task" src="{taskimages.data_url(i)}" width="{taskimages.WIDTH}" '
        f'alt="{html.escape(task)} image {n} ({i.width}x{i.height})">'
        for n, i in enumerate(got.images, 1)
    )
    return f'<div class="shots">{imgs}</div>', gold


def _eval_rows(evaluation: dict[str, Any]) -> str:
    rows = []
    for domain, items in sorted(evaluation["domains"].items()):
        p = pick(items)
        scored = [i for i in items if i.get("ok") is not None]
        passed = sum(bool(i.get("ok")) for i in scored)
        f = p["failure"]
        head = f'<div class="alarm">{html.escape(f["what"])} ({f["count"]} of {f["failed"]} failed)</div>' if f else ""
        rows.append(
            f'<tr><td class="l">{html.escape(domain)}</td><td>{passed}/{len(scored)}</td>'
            f"{_cell(p['best'], none='none passed')}{_cell(p['worst'], none='every item passed')}"
            f"{_cell(f['item'] if f else None, head, none='no failure')}</tr>"
        )
    return "".join(rows)


def samples_section(data: RunData) -> str:
    """Per evaluation (newest open, older ones folded) and domain: passed/scored, and the best,
    worst and most common failure among its items."""
    if not data.samples:
        return '<p class="empty">no evaluation samples in this run (eval_samples.jsonl is absent or empty)</p>'
    head = (
        '<tr><th class="l">domain</th><th>passed</th><th class="l">best</th><th class="l">worst</th>'
        '<th class="l">most common failure</th></tr>'
    )
    out = []
    for n, ev in enumerate(reversed(data.samples)):
        what = "full held-out set" if ev.get("eval") == "full" else "fixed subset"
        summary = f"step {ev['step']}: {what}"
        table = f'<table class="samples">{head}{_eval_rows(ev)}</table>'
        out.append(f"<details{' open' if n == 0 else ''}><summary>{html.escape(summary)}</summary>{table}</details>")
    return "".join(out)


def problems_note(runs: Sequence[RunData]) -> str:
    """What could not be read, per run, or nothing."""
    items = [f"<li>{html.escape(p)}</li>" for run in runs for p in run.problems]
    if not items:
        return ""
    head = "<b>Some records could not be read; the rest is shown.</b>"
    return f'<div class="problems">{head}<ul>{"".join(items)}</ul></div>'


CSS = """
.dashgrid{display:grid;grid-template-columns:repeat(auto-fill,minmax(340px,1fr));gap:10px}
figure.dash{min-height:60px}table.samples td.sample{max-width:340px;font-size:12px}
table.samples code{white-space:pre-wrap;word-break:break-word;background:#f6f8fa;padding:0 3px;border-radius:3px}
table.samples img.task{height:auto;border:1px solid #d0d7de;margin:2px 4px 2px 0}
details{margin:4px 0}summary{cursor:pointer;font-weight:600}
.problems{border:1px solid #cf222e;background:#fff5f5;border-radius:6px;padding:6px 12px;margin:12px 0}
"""
