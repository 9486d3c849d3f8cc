"""The release quality gate: a lossy fast tier must match the standard tier on held-out evals.

Invariant: a version's fast tier is recorded as lossy (`int8`) only when, for
every gated domain, its greedy held-out accuracy is within `max_drop` (1 point
= 0.01) of the standard tier's on the same tasks; otherwise the version is
recorded as `lossless`, whose greedy output equals the standard tier's by
construction (speculation verified by the float weights). A domain that one
tier could not score (every item an infra error) fails the gate: no verdict
rests on a missing figure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_DOMAINS = ("add", "sub", "mul", "reverse", "sort")


@dataclass(frozen=True)
class GateResult:
    """Per-domain held-out accuracy of both tiers and the verdict."""

    mode: str
    passed: bool
    max_drop: float
    tasks_per_domain: int
    standard: Mapping[str, float] = field(default_factory=dict)
    fast: Mapping[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "passed": self.passed,
            "max_drop": self.max_drop,
            "tasks_per_domain": self.tasks_per_domain,
            "standard": dict(self.standard),
            "fast": dict(self.fast),
            "delta": {d: round(self.fast[d] - self.standard[d], 4) for d in self.standard if d in self.fast},
        }


def quality_gate(
    model_dir: str | Path,
    mode: str = "int8",
    domains: tuple[str, ...] = DEFAULT_DOMAINS,
    tasks_per_domain: int = 50,
    max_drop: float = 0.01,
    difficulty: int = 1,
) -> GateResult:
    """Evaluate the standard tier and the `mode` fast tier of a model directory side by side."""
    from posttrain.configs.serve import FastTierConfig
    from posttrain.evaluate import evaluate
    from posttrain.model.arch import load_model
    from posttrain.serve.tiers import build_fast, standard_engine

    model, tok = load_model(model_dir)
    levels = {d: difficulty for d in domains}
    std = evaluate(standard_engine(model, tok), levels, tasks_per_domain)
    fast = evaluate(build_fast(model, tok, FastTierConfig(), mode, 0), levels, tasks_per_domain)
    s_acc, f_acc = std.accuracies, fast.accuracies  # infra-only domains left out of both
    scored = set(s_acc) == set(f_acc) == set(domains)
    passed = scored and all(f_acc[d] >= s_acc[d] - max_drop - 1e-9 for d in s_acc)
    return GateResult(mode, passed, max_drop, tasks_per_domain, s_acc, f_acc)
