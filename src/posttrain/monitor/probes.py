"""Reward-hacking probes: cheat outputs a sound verifier must reject.

Invariant: a cheat is an output that does not solve its task (the domain's
stricter check, where it has one, rejects it); a probe scores every cheat
of a few tasks against the live verifier and reports each one the verifier
passes. A verifier that raises on a cheat is an infra error, counted and
never read as acceptance or rejection.

What a cheat is, and what the stricter check recomputes, is domain
knowledge: each domain declares it in its own module (`Domain.cheats`,
`Domain.audit`, domains/base.py). This module only runs the probe.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.contracts.verifier import label
from posttrain.domains.base import Domain
from posttrain.errors import ErrorRecord, capture
from posttrain.types import Episode


@dataclass(frozen=True)
class Accepted:
    task_id: str
    cheat: str
    value: float


@dataclass(frozen=True)
class ProbeResult:
    """One domain's probe: how many cheats were scored and which ones passed."""

    domain: str
    verifier: str
    cheats: int
    accepted: tuple[Accepted, ...]
    infra_errors: int
    first_error: ErrorRecord | None = None

    @property
    def ok(self) -> bool:
        return not self.accepted

    def message(self) -> str:
        if self.ok:
            return f"{self.domain}: verifier {self.verifier} rejected all {self.cheats} cheats"
        first = self.accepted[0]
        return (
            f"{self.domain}: verifier {self.verifier} accepts {len(self.accepted)} of {self.cheats} cheat outputs "
            f"(e.g. {first.cheat!r} for task {first.task_id} scored {first.value:.2f}); refusing to train on it"
        )


def verifier_name(domain: Domain) -> str:
    return label(domain.verifier)


def probe_domain(domain: Domain, difficulty: int, tasks: int) -> ProbeResult | None:
    """Score the declared cheats of `tasks` train tasks; None when the domain declares none for them."""
    samples = [domain.sample(i, "train", difficulty) for i in range(tasks)]
    cheats = [(task, cheat) for task in samples for cheat in domain.cheats(task)]
    if not cheats:
        return None
    accepted, errors = [], []
    for task, cheat in cheats:
        try:
            score = domain.score(task, Episode(cheat))
        except Exception as exc:  # an infra error: neither acceptance nor rejection
            errors.append(capture(exc, "verifier"))
            continue
        if score.passed or score.value >= 1.0:
            accepted.append(Accepted(task.id, cheat, score.value))
    first = errors[0] if errors else None
    return ProbeResult(domain.name, verifier_name(domain), len(cheats), tuple(accepted), len(errors), first)
