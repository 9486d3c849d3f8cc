"""What the monitor asks the loop to do: typed actions, applied by the loop, never by the monitor.

Invariant: the monitor only observes and returns actions; the loop applies
them, in the order given, through the task pool's public API
(`TaskPool.set_weight`, `TaskPool.exclude`) or the run's countermeasures
(`Countermeasures.raise_entropy`, `Countermeasures.raise_diversity`) before
the next step draws tasks, and ends the run after the current step on a
`Stop`. Every action
the monitor returns has already been written (trace event, metrics row, log
line) with a `done` text that says what applying it does.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LowerWeight:
    """Multiply the domain's sampling weight by `factor` (0 < factor < 1)."""

    domain: str
    factor: float


@dataclass(frozen=True)
class ExcludeDomain:
    """Take the domain out of the drawable domains for the rest of the run."""

    domain: str
    reason: str


@dataclass(frozen=True)
class Stop:
    """End the run after the current step (final evaluation, checkpoint and report still run)."""

    reason: str


@dataclass(frozen=True)
class RaiseEntropyBonus:
    """Raise the domain's entropy-bonus coefficient to `coef` (the run then uses the larger of it
    and the configured trainer.entropy_bonus coefficient)."""

    domain: str
    coef: float


@dataclass(frozen=True)
class RaiseDiversityReward:
    """Raise the domain's diversity-reward weight to `weight` (the run then uses the larger of it
    and the configured rollout.diversity_reward weight)."""

    domain: str
    weight: float


Action = LowerWeight | ExcludeDomain | Stop | RaiseEntropyBonus | RaiseDiversityReward
