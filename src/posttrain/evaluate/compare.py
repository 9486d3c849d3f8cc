"""Two models (or runs) on the same held-out items: per-domain paired deltas, marked.

Invariant: both sides are scored on one `HeldoutSet` (a run's stored
heldout.json when one side is a run, else the one the config builds), item
by item, so every delta is paired; a domain is called improved or regressed
only when its paired interval excludes 0 and the exact McNemar test agrees.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.errors import ConfigError
from posttrain.evaluate.core import EvalOptions, EvalTable, evaluate_heldout
from posttrain.evaluate.heldout import HeldoutSet
from posttrain.evaluate.tables import deltas_json, format_details, format_probes, format_table, format_turns


@dataclass(frozen=True)
class Side:
    """One side of a comparison: a model directory, and the run it came from (if any)."""

    label: str
    model_dir: Path
    run_dir: Path | None


def resolve(spec: str) -> Side:
    """A run directory (its latest checkpoint; a LoRA adapter merged into the run's base once,
    `trainer.export.servable`), one of a run's LoRA checkpoints (merged the same way), or a Hugging
    Face model directory."""
    from posttrain.model.arch import check_model_dir
    from posttrain.trainer.export import servable

    path = Path(spec)
    if (path / "config.yaml").is_file():
        from posttrain.trainer.checkpoint import latest_checkpoint

        ckpt = latest_checkpoint(path)
        if ckpt is None:
            raise ConfigError(f"run directory {spec!r} has no checkpoint to evaluate")
        return Side(path.name, servable(ckpt), path)
    return Side(path.name, check_model_dir(servable(path) if path.is_dir() else path), None)


def heldout_of(a: Side, b: Side, explicit: str | None, build: Any) -> HeldoutSet:
    """--heldout, else the first side's run's stored set, else `build()` from the config."""
    if explicit:
        return HeldoutSet.load(explicit)
    for side in (a, b):
        if side.run_dir is not None and (side.run_dir / "heldout.json").is_file():
            return HeldoutSet.load(side.run_dir / "heldout.json")
    return build()


def compare_tables(a: EvalTable, b: EvalTable, seed: int = 0) -> dict[str, Any]:
    """eval.json-shaped comparison: `before` is A, `after` is B, with paired deltas of the core sets
    and of the probes."""
    found = deltas_json(a, b, seed)
    per = found["domains"].items()
    return {
        "before": a.to_json(),
        "after": b.to_json(),
        "deltas": found,
        "improved": sorted(k for k, v in per if v["significant"] and v["delta"] > 0),
        "regressed": sorted(k for k, v in per if v["significant"] and v["delta"] < 0),
    }


def run_compare(
    a: Side, b: Side, heldout: HeldoutSet, opts: EvalOptions, device: str = "cpu", seed: int = 0
) -> tuple[EvalTable, EvalTable, dict[str, Any]]:
    from posttrain.engine.hf import HFEngine

    tables = []
    for side in (a, b):
        engine = HFEngine.from_pretrained(side.model_dir, device=device, seed=seed)
        tables.append(evaluate_heldout(engine, heldout, opts))
        del engine
    data = compare_tables(tables[0], tables[1], seed)
    data["a"], data["b"] = {"label": a.label, "model": str(a.model_dir)}, {"label": b.label, "model": str(b.model_dir)}
    data["heldout"] = {**heldout.to_json(), "version": heldout.version}
    return tables[0], tables[1], data


def text(a: Side, b: Side, ta: EvalTable, tb: EvalTable, data: dict[str, Any]) -> str:
    lines = [
        f"A = {a.label} ({a.model_dir})",
        f"B = {b.label} ({b.model_dir})",
        format_table(ta, tb, labels=("A", "B")),
        format_turns(ta, tb, labels=("A", "B")),
        "B in detail:",
        format_details(tb),
        format_probes(ta, tb, labels=("A", "B")),
        "significantly improved (B over A): " + (", ".join(data["improved"]) or "none"),
        "significantly regressed: " + (", ".join(data["regressed"]) or "none"),
    ]
    return "\n".join(line for line in lines if line)


def write_outputs(out: Path, data: dict[str, Any]) -> tuple[Path, Path, Path]:
    """compare.json, compare.png (deltas with intervals) and compare.html (tables and the plot)."""
    import base64

    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from posttrain.report.evalhtml import (
        _CSS_EXTRA,
        before_after_table,
        delta_bars,
        probes_table,
        turns_table,
        verifier_table,
    )

    out.mkdir(parents=True, exist_ok=True)
    js, png, page = out / "compare.json", out / "compare.png", out / "compare.html"
    js.write_text(json.dumps(data, indent=1))
    fig = delta_bars(
        list(data["before"]["domains"]),
        data["deltas"]["domains"],
        "B - A per domain, paired 95% intervals (coloured: significant)",
    )
    fig.savefig(png, dpi=90, bbox_inches="tight")
    plt.close(fig)
    import html as h

    from posttrain.report.html import _CSS

    src = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
    a, b = data["a"], data["b"]
    page.write_text(f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>posttrain compare</title><style>{_CSS}{_CSS_EXTRA}</style></head><body>
<h1>posttrain compare</h1>
<p class="meta">A = {h.escape(a["label"])} ({h.escape(a["model"])})<br>B = {h.escape(b["label"])} ({h.escape(b["model"])})<br>
held-out set version {h.escape(data["heldout"]["version"])}</p>
<p>significantly improved (B over A): <b>{h.escape(", ".join(data["improved"]) or "none")}</b>;
significantly regressed: <b>{h.escape(", ".join(data["regressed"]) or "none")}</b></p>
{before_after_table(data, labels=("A", "B"))}
<figure><img src="{src}" alt="deltas"><figcaption>B - A per domain with paired 95% intervals</figcaption></figure>
{turns_table(data, labels=("A", "B"))}
<h3>Training verifier vs eval verifier (B)</h3>{verifier_table(data["after"])}
<h3>Generalisation probes</h3>{probes_table(data)}
</body></html>
""")
    return js, png, page
