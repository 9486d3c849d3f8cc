"""A plan as a table (stdout), as JSON and as a PNG in the report's style (matplotlib, Agg)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from posttrain.plan import Plan, Prediction

COLUMNS = ("generate", "execute", "verify", "trainer")


def _split(p: Prediction) -> str:
    g, e, v = p.workers
    return f"{g}/{e}/{v}"


def text(plan: Plan, top: int = 8) -> str:
    """The measured costs, the prediction for the cluster's split and the best splits found."""
    m = plan.as_dict()["measured"]
    lines = [
        f"plan for {plan.run} ({plan.shape.mode}, k={plan.shape.max_staleness}, "
        f"{plan.shape.prompts_per_step} groups per step)",
        f"measured: {m['groups']} groups, engine {m['engine_tokens_per_s']:.1f} tok/s over "
        f"{m['generation_calls']} calls, train {m['train_s_per_token'] * 1e3:.3f} ms/token, "
        f"step overhead {m['step_overhead_s_mean']:.2f} s",
        "",
        "| domain | share | tokens/group | execute s mean | execute s max | verify s mean |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, d in m["domains"].items():
        lines.append(
            f"| {name} | {d['share']:.0%} | {d['tokens_mean']:.1f} | {d['execute_s_mean']:.2f} "
            f"| {d['execute_s_max']:.2f} | {d['verify_s_mean']:.3f} |"
        )
    lines += ["", "| split g/e/v | steps/h | step s | " + " | ".join(COLUMNS) + " | bottleneck |"]
    lines.append("|---|---:|---:|" + "---:|" * len(COLUMNS) + "---|")
    ranked = sorted(plan.searched, key=lambda p: -p.steps_per_hour)[:top]
    for label, p in [("cluster", plan.current), ("best", plan.best), *(("", q) for q in ranked)]:
        util = " | ".join(f"{p.utilisation[c]:.0%}" for c in COLUMNS)
        name = f"{_split(p)} ({label})" if label else _split(p)
        lines.append(f"| {name} | {p.steps_per_hour:.0f} | {p.step_s_mean:.2f} | {util} | {p.bottleneck} |")
    return "\n".join(lines)


def write_json(plan: Plan, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan.as_dict(), indent=1))
    return path


def write_png(plan: Plan, path: Path, top: int = 12) -> Path:
    """Left: steps per hour of the best splits (the cluster's in black). Right: each stage's
    utilisation under the cluster's split and the best one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranked = sorted(plan.searched, key=lambda p: -p.steps_per_hour)[:top]
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 3.2), squeeze=False)
    ax = axes[0][0]
    names = [_split(p) for p in ranked]
    ax.bar(range(len(ranked)), [p.steps_per_hour for p in ranked], color="C0", width=0.6)
    ax.axhline(plan.current.steps_per_hour, color="black", linewidth=1, label=f"cluster {_split(plan.current)}")
    ax.set_xticks(range(len(ranked)), names, rotation=45, fontsize=8)
    ax.set_ylabel("steps per hour")
    ax.set_title("splits (generate/execute/verify)", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[0][1]
    for i, (label, p) in enumerate((("cluster", plan.current), ("best", plan.best))):
        xs = [j + (i - 0.5) * 0.35 for j in range(len(COLUMNS))]
        ax.bar(xs, [p.utilisation[c] for c in COLUMNS], width=0.35, color=f"C{i}", label=f"{label} {_split(p)}")
    ax.set_xticks(range(len(COLUMNS)), COLUMNS)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("busy share")
    ax.set_title("utilisation", fontsize=10)
    ax.legend(fontsize=8)
    for a in axes[0]:
        a.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return path
