"""Held-out evaluation per domain: seeded, greedy, reproducible.

Invariant: the same model, domains, difficulties and `tasks_per_domain`
give the same table twice; only eval-split tasks are used, and every
completion is scored by its domain's own verifier. A verifier that raises
counts as an infra error, not as a wrong answer.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from posttrain.domains.registry import get
from posttrain.engine.base import Engine
from posttrain.types import Episode, GenerationRequest, SamplingParams, Task, to_dict


@dataclass(frozen=True)
class DomainResult:
    domain: str
    difficulty: int
    n: int
    accuracy: float
    mean_score: float
    infra_errors: int = 0


@dataclass(frozen=True)
class EvalTable:
    model_version: int
    results: Mapping[str, DomainResult] = field(default_factory=dict)

    @property
    def mean_accuracy(self) -> float:
        vals = [r.accuracy for r in self.results.values()]
        return sum(vals) / len(vals) if vals else 0.0

    def to_json(self) -> dict:
        return {"model_version": self.model_version, "mean_accuracy": self.mean_accuracy, "domains": to_dict(dict(self.results))}

    @classmethod
    def from_json(cls, data: dict) -> "EvalTable":
        return cls(data["model_version"], {k: DomainResult(**v) for k, v in data["domains"].items()})


def eval_tasks(domain: str, difficulty: int, n: int) -> list[Task]:
    dom = get(domain)
    return [dom.sample(i, "eval", difficulty) for i in range(n)]


def evaluate(
    engine: Engine,
    difficulties: Mapping[str, int],
    tasks_per_domain: int,
    max_tokens: int = 16,
    batch_size: int = 256,
) -> EvalTable:
    """Greedy held-out accuracy per domain."""
    results = {}
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, n=1, seed=0)
    for name, level in difficulties.items():
        tasks = eval_tasks(name, level, tasks_per_domain)
        scores, errors = [], 0
        for start in range(0, len(tasks), batch_size):
            chunk = tasks[start : start + batch_size]
            reqs = [GenerationRequest(engine.encode_chat(t.prompt), params, t.id) for t in chunk]
            for task, group in zip(chunk, engine.generate(reqs)):
                done = group[0]
                try:
                    scores.append(get(name).score(task, Episode(done.text, finish_reason=done.finish_reason)))
                except Exception:  # an infra error: excluded from the accuracy, counted
                    errors += 1
        n = len(scores)
        acc = sum(s.passed for s in scores) / n if n else 0.0
        mean = sum(s.value for s in scores) / n if n else 0.0
        results[name] = DomainResult(name, level, n, acc, mean, errors)
    return EvalTable(engine.version, results)


def format_table(before: EvalTable, after: EvalTable | None = None) -> str:
    """A plain-text before/after table with the mean row."""
    lines = [f"{'domain':<24}{'level':>6}{'n':>6}{'before':>9}" + (f"{'after':>9}{'delta':>9}" if after else "")]
    for name, b in before.results.items():
        row = f"{name:<24}{b.difficulty:>6}{b.n:>6}{b.accuracy:>9.3f}"
        if after and name in after.results:
            a = after.results[name].accuracy
            row += f"{a:>9.3f}{a - b.accuracy:>+9.3f}"
        lines.append(row)
    mean = f"{'mean':<24}{'':>6}{'':>6}{before.mean_accuracy:>9.3f}"
    if after:
        mean += f"{after.mean_accuracy:>9.3f}{after.mean_accuracy - before.mean_accuracy:>+9.3f}"
    lines.append(mean)
    return "\n".join(lines)


def write_table(path: Path, before: EvalTable, after: EvalTable | None, history: Sequence[tuple[int, EvalTable]] = ()) -> None:
    data = {
        "before": before.to_json(),
        "after": after.to_json() if after else None,
        "history": [{"step": s, **t.to_json()} for s, t in history],
    }
    path.write_text(json.dumps(data, indent=2))
