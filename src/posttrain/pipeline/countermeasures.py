"""Countermeasures to collapse that the loop applies: each domain's entropy-bonus coefficient
and the diversity reward within a group.

Invariant: a domain's coefficient (or weight) is the larger of the configured one and the one the
monitor raised it to (`raise_entropy`, `raise_diversity`, applied by the loop). The diversity
reward never changes the verifier's reward: a rollout keeps its Score, and its bonus rides beside
it (`Rollout.diversity_bonus`; the trainer reads `Rollout.train_reward`, the trace the part
`diversity_bonus`). A rollout's bonus is at most half the gap to the next higher verifier reward
in its group, so no rollout ever overtakes a group-mate the verifier scored higher: a diverse
wrong answer never beats a correct one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from posttrain.configs.rollout import DiversityRewardConfig
from posttrain.configs.trainer import EntropyBonusConfig
from posttrain.domains.base import extract_answer
from posttrain.rollout import Rollout


def answer_novelty(texts: Sequence[str]) -> list[float]:
    """Per text: 1 - the share of the other texts whose extracted final answer equals its own
    (1: an answer no group-mate gave; 0: every group-mate gave it; 0 for a lone text)."""
    answers = [extract_answer(t) for t in texts]
    others = len(texts) - 1
    return [1.0 - (answers.count(a) - 1) / others if others else 0.0 for a in answers]


def ngram_novelty(texts: Sequence[str], n: int) -> list[float]:
    """Per text: the share of its distinct character n-grams that no other text holds
    (0 for a text shorter than n)."""
    grams = [{t[i : i + n] for i in range(len(t) - n + 1)} for t in texts]
    out = []
    for i, own in enumerate(grams):
        rest = set().union(*(g for j, g in enumerate(grams) if j != i))
        out.append(len(own - rest) / len(own) if own else 0.0)
    return out


def diversity_bonuses(rewards: Sequence[float], novelty: Sequence[float], weight: float) -> list[float]:
    """weight x novelty per rollout, capped at half the gap from its verifier reward to the next
    higher one in the group (no cap for the highest): v_a < v_b implies v_a + bonus_a < v_b."""
    out = []
    for v, nov in zip(rewards, novelty, strict=True):
        higher = [u for u in rewards if u > v]
        cap = (min(higher) - v) / 2 if higher else weight
        out.append(min(weight * nov, cap))
    return out


@dataclass
class Countermeasures:
    """The run's entropy-bonus coefficients and diversity-reward weights, per domain."""

    entropy: EntropyBonusConfig
    diversity: DiversityRewardConfig
    ngram: int = 2
    """n of the ngram novelty (monitor.diversity.n)."""
    raised_entropy: dict[str, float] = field(default_factory=dict)
    raised_diversity: dict[str, float] = field(default_factory=dict)

    def entropy_coef(self, domain: str) -> float:
        configured = self.entropy.domains.get(domain, self.entropy.coef)
        return max(configured, self.raised_entropy.get(domain, 0.0))

    def diversity_weight(self, domain: str) -> float:
        configured = self.diversity.domains.get(domain, self.diversity.weight)
        return max(configured, self.raised_diversity.get(domain, 0.0))

    def raise_entropy(self, domain: str, coef: float) -> None:
        self.raised_entropy[domain] = max(coef, self.raised_entropy.get(domain, 0.0))

    def raise_diversity(self, domain: str, weight: float) -> None:
        self.raised_diversity[domain] = max(weight, self.raised_diversity.get(domain, 0.0))

    def shape(self, groups: Sequence[Sequence[Rollout]]) -> list[list[Rollout]]:
        """The groups with each scored rollout's diversity bonus set, in the domains whose weight
        is above 0 (the rest, and masked rollouts, keep `diversity_bonus` None)."""
        return [self._shape_group(g) for g in groups]

    def _shape_group(self, group: Sequence[Rollout]) -> list[Rollout]:
        weight = self.diversity_weight(group[0].task.domain) if group else 0.0
        scored = [r for r in group if r.reward is not None]
        if weight <= 0.0 or not scored:
            return list(group)
        texts = [r.completion.text for r in scored]
        novelty = answer_novelty(texts) if self.diversity.novelty == "answer" else ngram_novelty(texts, self.ngram)
        bonus = dict(zip((r.id for r in scored), diversity_bonuses([r.reward or 0.0 for r in scored], novelty, weight)))
        return [dataclasses.replace(r, diversity_bonus=bonus[r.id]) if r.id in bonus else r for r in group]

    def row(self, domains: Sequence[str]) -> dict[str, dict[str, float]]:
        """The metrics row's view: each domain's coefficient and weight in use (those above 0)."""
        entropy = {d: self.entropy_coef(d) for d in domains if self.entropy_coef(d) > 0}
        diversity = {d: self.diversity_weight(d) for d in domains if self.diversity_weight(d) > 0}
        return {"entropy_bonus_coef": entropy, "diversity_weight": diversity}
