"""The Budget contract: what one episode of a domain may spend.

Invariant: a Budget is frozen; the pipeline and the evaluator resolve one per domain
(pipeline/budget.py: the domain's own, then `tasks.domains.<name>` overrides) and
generate, step and time each episode within it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    """Per-episode limits: turns, generated tokens per turn, wall seconds. The
    pipeline and the evaluator generate each domain's turns with its own token
    budget (overridable per domain in `tasks.domains`)."""

    turns: int = 1
    tokens: int = 16
    seconds: float = 30.0
    train_from: int = 1
    """The first turn whose actions carry the loss (1: every action; 2: the revisions only, the
    first attempt no gradient of its own, as in SCoRe's first stage). Counted in the episode as
    the domain declares it: a derived task's prompt turns (`TaskMeta.branched`) count. Training
    only: evaluation plays and scores every turn alike."""
