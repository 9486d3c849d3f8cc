"""Task-set hygiene: normalised keys for dedupe, n-gram contamination reports,
eval rotation.

Invariant: `prompt_key` of two tasks is equal exactly when their prompts are
equal after normalisation (case folded, whitespace collapsed, digits kept),
so dedupe never merges two questions that differ in a number.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from posttrain.types import Task

_WS = re.compile(r"\s+")
_WORD = re.compile(r"\w+|[^\w\s]")


def prompt_text(task: Task) -> str:
    """The prompt as text, each image named by its size and digest (`Message.as_text`): two image
    tasks that ask the same question of different images are different tasks."""
    return "\n".join(m.as_text() for m in task.prompt)


def normalise(text: str) -> str:
    return _WS.sub(" ", text).strip().casefold()


def prompt_key(task: Task) -> str:
    """A short hash of the normalised prompt."""
    return hashlib.sha256(f"{task.domain}\x1f{normalise(prompt_text(task))}".encode()).hexdigest()[:16]


def exact_key(task: Task) -> str:
    return hashlib.sha256(f"{task.domain}\x1f{prompt_text(task)}".encode()).hexdigest()[:16]


@dataclass(frozen=True)
class DedupeReport:
    total: int
    exact_duplicates: int
    normalised_duplicates: int
    kept: tuple[Task, ...]


def dedupe(tasks: Iterable[Task]) -> DedupeReport:
    """Drop tasks whose prompt repeats an earlier one, exactly or after normalisation."""
    seen_exact: set[str] = set()
    seen_norm: set[str] = set()
    kept, exact, norm, total = [], 0, 0, 0
    for task in tasks:
        total += 1
        e, k = exact_key(task), prompt_key(task)
        if e in seen_exact:
            exact += 1
        elif k in seen_norm:
            norm += 1
        else:
            kept.append(task)
        seen_exact.add(e)
        seen_norm.add(k)
    return DedupeReport(total, exact, norm, tuple(kept))


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = _WORD.findall(normalise(text))
    return {tuple(words[i : i + n]) for i in range(max(len(words) - n + 1, 0))} or ({tuple(words)} if words else set())


@dataclass(frozen=True)
class ContaminationReport:
    """Share of eval tasks whose n-grams overlap the train set's by at least `threshold`."""

    domain: str
    n: int
    threshold: float
    eval_tasks: int
    train_tasks: int
    exact_overlap: int
    contaminated: int
    max_overlap: float
    mean_overlap: float


def contamination(
    domain: str,
    train: Sequence[Task],
    eval_: Sequence[Task],
    n: int = 8,
    threshold: float = 0.5,
    template_df: float = 0.05,
) -> ContaminationReport:
    """N-gram overlap of each eval prompt with the union of train prompt n-grams.

    Procedural prompts share their template text, so n-grams found in more
    than `template_df` of the train prompts (and at least 2) are template, not
    content, and are left out on both sides; an eval prompt with no content
    n-grams left counts as overlap 0."""
    if n < 1:
        raise ValueError(f"contamination: n must be >= 1, got {n}")
    train_sets = [ngrams(prompt_text(t), n) for t in train]
    df: dict[tuple[str, ...], int] = {}
    for grams in train_sets:
        for g in grams:
            df[g] = df.get(g, 0) + 1
    cutoff = max(2, template_df * len(train_sets))
    template = {g for g, c in df.items() if c > cutoff}
    train_grams = set(df) - template
    train_keys = {prompt_key(t) for t in train}
    overlaps = []
    for task in eval_:
        grams = ngrams(prompt_text(task), n) - template
        overlaps.append(len(grams & train_grams) / len(grams) if grams else 0.0)
    exact = sum(prompt_key(t) in train_keys for t in eval_)
    return ContaminationReport(
        domain=domain,
        n=n,
        threshold=threshold,
        eval_tasks=len(eval_),
        train_tasks=len(train),
        exact_overlap=exact,
        contaminated=sum(o >= threshold for o in overlaps),
        max_overlap=max(overlaps, default=0.0),
        mean_overlap=sum(overlaps) / len(overlaps) if overlaps else 0.0,
    )


def eval_indices(n: int, rotation: int = 0) -> range:
    """Indices of eval set number `rotation`: disjoint blocks of `n`, so rotating
    the eval set never reuses an item of an earlier rotation."""
    if n < 0 or rotation < 0:
        raise ValueError(f"eval_indices: n and rotation must be >= 0, got n={n}, rotation={rotation}")
    return range(rotation * n, (rotation + 1) * n)
