"""Eval verifiers: the training verifier, made stricter where a domain has a stricter check.

Invariant: an eval verifier never accepts what the training verifier rejects
(its verdict is the training verdict AND every stricter check), so a gap
between the two pass rates can only mean the policy found something the
training verifier lets through. Stricter checks, in order: the domain's
audit (`Domain.audit`, where it declares one: for the built-in domains the
answer recomputed from the prompt), and format exactness for exact-match
domains (the completion is the answer and nothing else, bare or in one
answer tag).
"""

from __future__ import annotations

from collections.abc import Callable

from posttrain.domains.base import Domain, ExactMatch
from posttrain.types import Task

Check = Callable[[Task, str], bool]


def format_exact(task: Task, completion: str) -> bool:
    """The completion is exactly the reference, bare or as `<answer>REF</answer>`."""
    text, ref = completion.strip(), str(task.reference)
    return text == ref or text == f"<answer>{ref}</answer>"


def checks_of(domain: Domain) -> list[tuple[str, Check]]:
    """The named stricter checks of a domain (empty: eval uses the training verifier alone)."""
    out: list[tuple[str, Check]] = []
    if domain.has_audit:
        out.append(("audit", domain.audit))
    if isinstance(domain.verifier, ExactMatch):
        out.append(("format", format_exact))
    return out


def eval_verifier_name(domain: Domain) -> str:
    return "+".join([domain.verifier.name, *(name for name, _ in checks_of(domain))])
