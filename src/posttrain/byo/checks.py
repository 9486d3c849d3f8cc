"""Checks of a task file before training: `posttrain tasks validate` and `stats`.

Invariant: read-only, one streaming pass over the rows plus one read per
scored row; every problem is reported with the line (or row number) where a
person finds it. A verifier that rejects its own file's reference answers
is caught here, before any training step.
"""

from __future__ import annotations

import hashlib
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from posttrain.byo.domain import SourceDomain
from posttrain.domains.hygiene import exact_key, normalise, prompt_text
from posttrain.types import Episode

_NEAR = re.compile(r"[^\w]+")


@dataclass
class Report:
    """What `validate` and `stats` print for one source domain."""

    name: str
    path: str
    unit: str
    rows: int = 0
    bad: list[tuple[int, str]] = field(default_factory=list)
    train: int = 0
    eval: int = 0
    skipped: int = 0
    levels: int = 1
    duplicates: int = 0
    near_duplicates: int = 0
    overlap_rows: int = 0
    overlap_near: int = 0
    gold_scored: int = 0
    gold_passed: int = 0
    gold_infra: int = 0
    no_gold: int = 0
    gold_failures: list[tuple[int, str]] = field(default_factory=list)
    infra_examples: list[tuple[int, str]] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.bad and not self.gold_failures and not self.gold_infra and self.train > 0 and self.eval > 0

    def problems(self) -> list[str]:
        out = [f"{self.unit} {line}: {msg}" for line, msg in self.bad]
        out += [f"{self.unit} {line}: gold answer scored below 1 ({why})" for line, why in self.gold_failures]
        out += [
            f"{self.unit} {line}: gold answer could not be scored (infra error: {why})"
            for line, why in self.infra_examples[:3]
        ]
        if self.gold_infra > 3:
            out.append(f"... {self.gold_infra} gold answers in all could not be scored (infra errors)")
        out += [f"no {s} rows" for s, n in (("train", self.train), ("held-out", self.eval)) if not n]
        return out


def _near_key(text: str) -> str:
    return hashlib.sha1(_NEAR.sub(" ", normalise(text)).strip().encode()).hexdigest()


def inspect(domain: SourceDomain, score_gold: int = 200, tokenizer: Any = None) -> Report:
    """Schema check, duplicates, train/held-out overlap, gold scored on up to `score_gold` rows per split,
    prompt lengths in tokens of `tokenizer` (characters when None)."""
    idx = domain.index
    rep = Report(domain.name, domain.path, domain.reader.unit, levels=len(idx.levels))
    rep.bad = list(idx.errors)
    rep.skipped, rep.overlap_rows = idx.skipped, idx.overlap
    rep.train, rep.eval = idx.size("train"), idx.size("eval")
    rep.rows = len(idx.locs) + len(idx.errors) + idx.skipped + idx.overlap
    seen_exact: dict[str, str] = {}
    seen_near: dict[str, set[str]] = {}
    for split in ("train", "eval"):
        for lv in idx.levels:
            for pos in idx.pools.get((split, lv), ()):
                task = domain.task_at(pos, split, lv)
                text = prompt_text(task)
                exact, near = exact_key(task), _near_key(text)
                if exact in seen_exact:
                    rep.duplicates += 1
                elif near in seen_near and split in seen_near[near]:
                    rep.near_duplicates += 1
                elif near in seen_near:
                    rep.overlap_near += 1
                seen_exact.setdefault(exact, split)
                seen_near.setdefault(near, set()).add(split)
                rep.lengths.append(prompt_tokens(tokenizer, task.prompt) if tokenizer is not None else len(text))
    _score_gold(domain, rep, score_gold)
    return rep


def prompt_tokens(tokenizer: Any, messages: Any) -> int:
    """Tokens the model reads for this prompt: its chat template with the generation prompt, when it has one."""
    if getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages], add_generation_prompt=True, tokenize=True
        )
        return len(out["input_ids"] if hasattr(out, "keys") else out)
    return len(tokenizer("\n".join(m.content for m in messages))["input_ids"])


def _score_gold(domain: SourceDomain, rep: Report, limit: int) -> None:
    idx = domain.index
    for split in ("train", "eval"):
        positions = [p for lv in idx.levels for p in idx.pools.get((split, lv), ())][:limit]
        for pos in positions:
            task = domain.task_at(pos, split, 1)
            line = idx.lines[pos]
            try:
                gold = domain.declared_gold(task)
                if gold is None:  # the verifier cannot build one for this row (code without a solution column)
                    rep.no_gold += 1
                    continue
                score = domain.score(task, Episode(gold))
            except Exception as exc:  # noqa: BLE001 - report, never crash the check
                if type(exc).__name__ == "TaskError":
                    rep.gold_failures.append((line, str(exc)))
                else:
                    rep.gold_infra += 1
                    rep.infra_examples.append((line, f"{type(exc).__name__}: {exc}"))
                continue
            rep.gold_scored += 1
            rep.gold_passed += score.passed
            if not score.passed:
                rep.gold_failures.append((line, score.reason or f"value {score.value:.2f}"))


def length_summary(lengths: list[int]) -> str:
    if not lengths:
        return "no rows"
    xs = sorted(lengths)
    q = lambda p: xs[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
    return f"min {xs[0]} | p50 {q(0.5)} | p90 {q(0.9)} | p99 {q(0.99)} | max {xs[-1]} | mean {statistics.fmean(xs):.1f}"
