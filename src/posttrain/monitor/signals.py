"""Per-domain, per-step training signals computed from one step's rollout groups.

Invariant: signals are a pure function of the step's groups, the set of
groups kept for training and the trainer's per-rollout links; infra-error
rollouts count only in `infra_error_rate` (never as reward 0), and a domain
appears in a step's signals exactly when it had at least one rollout.
Token-level entropy is the mean negative log-probability of the sampled
tokens under the sampling policy: an unbiased estimate of the policy's
per-token entropy at the sampling temperature, at no extra forward pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from posttrain.monitor.diversity import distinct_answers, distinct_n, mean_pairwise_edit
from posttrain.trainer.batch import RolloutLink

Link = RolloutLink
"""What the train step did with one rollout: the trainer's own record (StepStats.rollouts)."""


@dataclass(frozen=True)
class DomainSignals:
    """One domain's signals at one step. Rates are shares in [0, 1]."""

    rollouts: int
    scored: int
    reward_mean: float
    reward_std: float
    pass_rate: float
    entropy: float
    distinct_answers: float
    distinct_n: float
    edit_distance: float
    length_mean: float
    truncated_share: float
    adv_mean: float
    adv_std: float
    ratio_mean: float
    clip_share: float
    groups: int
    filtered_share: float
    infra_error_rate: float
    programmatic_mean: float | None = None
    """Mean of the score part `programmatic` (a judge's shadow score by its `checks.labels` verifier)
    over the scored rollouts that carry it; None when none does."""
    swap_disagreement: float | None = None
    """Mean of the part `swap_disagree` (a pairwise judge's two orders disagreeing); None when absent."""
    judge_agreement: float | None = None
    """Mean of the part `agreement` (a judge ensemble's pairwise agreement); None when absent."""

    def as_dict(self) -> dict[str, Any]:
        """`dataclasses.asdict` of these flat numbers, without its deep copy."""
        return {name: getattr(self, name) for name in _SIGNAL_FIELDS}


_SIGNAL_FIELDS = tuple(f.name for f in fields(DomainSignals))


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _std(xs: Sequence[float]) -> float:
    if not xs:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


def _entropy(rollouts: Sequence[Any]) -> float:
    logps = [lp for r in rollouts for lp in r.completion.logprobs]
    return -_mean(logps) if logps else 0.0


def domain_signals(
    groups: Sequence[Sequence[Any]],
    kept_ids: set[str],
    links: Mapping[str, Link],
    n: int = 2,
    edit: Sequence[float] | None = None,
    max_chars: int = 64,
) -> DomainSignals:
    """Signals of one domain's groups. `kept_ids` holds the group ids of the groups
    kept for training; `links` maps a rollout's id to its train link; `edit` is each
    group's mean pairwise edit distance when already computed."""
    rollouts = [r for g in groups for r in g]
    scored = [r for r in rollouts if r.reward is not None]
    rewards = [r.reward for r in scored]
    texts = [[r.completion.text for r in g] for g in groups]
    used = [links[r.id] for r in rollouts if r.id in links]
    advs = [u.advantage for u in used]
    return DomainSignals(
        rollouts=len(rollouts),
        scored=len(scored),
        reward_mean=_mean(rewards),
        reward_std=_std(rewards),
        pass_rate=_mean([float(bool(r.score.passed)) for r in scored]),
        entropy=_entropy(rollouts),
        distinct_answers=_mean([distinct_answers(t) for t in texts]),
        distinct_n=_mean([distinct_n(t, n) for t in texts]),
        edit_distance=_mean(edit if edit is not None else mean_pairwise_edit(texts, max_chars)),
        length_mean=_mean([len(r.completion.token_ids) for r in rollouts]),
        truncated_share=_mean([float(r.completion.finish_reason == "length") for r in rollouts]),
        adv_mean=_mean(advs),
        adv_std=_std(advs),
        ratio_mean=_mean([u.ratio for u in used if u.ratio is not None]),
        clip_share=_mean([u.clipped for u in used if u.clipped is not None]),
        groups=len(groups),
        filtered_share=_mean([float(g[0].group_id not in kept_ids) for g in groups]),
        infra_error_rate=(len(rollouts) - len(scored)) / len(rollouts) if rollouts else 0.0,
        programmatic_mean=_part_mean(scored, "programmatic"),
        swap_disagreement=_part_mean(scored, "swap_disagree"),
        judge_agreement=_part_mean(scored, "agreement"),
    )


def _part_mean(scored: Sequence[Any], part: str) -> float | None:
    """Mean of a score part over the rollouts whose score has it (None when none has)."""
    xs = [r.score.parts[part] for r in scored if part in r.score.parts]
    return _mean(xs) if xs else None


def step_signals(
    groups: Sequence[Sequence[Any]],
    kept: Sequence[Sequence[Any]],
    links: Mapping[str, Link],
    n: int = 2,
    max_chars: int = 64,
) -> dict[str, DomainSignals]:
    """Signals per domain (sorted by name) of one step."""
    groups = [g for g in groups if g]
    texts = [[r.completion.text for r in g] for g in groups]
    edit = dict(zip((g[0].group_id for g in groups), mean_pairwise_edit(texts, max_chars)))
    by_domain: dict[str, list[Sequence[Any]]] = {}
    for g in groups:
        by_domain.setdefault(g[0].task.domain, []).append(g)
    kept_ids = {g[0].group_id for g in kept if g}
    signals = {}
    for d, gs in sorted(by_domain.items()):
        signals[d] = domain_signals(gs, kept_ids, links, n, [edit[g[0].group_id] for g in gs])
    return signals
