"""Bias checks of an LLM judge, run before training (issue 28, item 2).

Invariant: a check reads the judge only through the domain's own verifier, on
train rows of that domain, and labels every item with the judge's programmatic
`checks.labels` verifier (never with an assumed label): four items per row, the
labels verifier's gold and wrong answers, each concise and padded with the same
prose before it. From the same judgements it measures the judge's agreement
with the labels (with its 95% Wilson interval), its length bias (mean reward of
the padded forms minus the concise ones) and, for pairwise judges, the share of
items whose two orders disagree (the `swap_disagree` part). An item the judge
cannot score (an infra error) is counted apart, never as a disagreement; a
check with no scored item is reported as not measured and does not fire.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from posttrain.byo.domain import SourceDomain
from posttrain.byo.models import JudgeEnsemble, JudgeVerifier
from posttrain.configs.byo import JudgeChecks
from posttrain.contracts.verifier import label
from posttrain.domains.base import Domain
from posttrain.evaluate.stats import wilson
from posttrain.types import Episode, Task


@dataclass(frozen=True)
class JudgeCheck:
    """One judge domain's bias figures at run start, and which checks fired."""

    domain: str
    verifier: str
    items: int
    infra_errors: int
    agreement: float | None
    agreement_low: float
    agreement_high: float
    length_bias: float | None
    swap_disagreement: float | None
    """None for a pointwise judge (no positions to swap)."""
    fired: tuple[str, ...]
    """Names of the checks past their thresholds: calibration, length, position_swap."""

    def message(self) -> str:
        def fmt(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.2f}"

        figures = (
            f"judge {self.verifier} on {self.domain}: agreement with programmatic labels {fmt(self.agreement)} "
            f"[{self.agreement_low:.2f}, {self.agreement_high:.2f}] over {self.items - self.infra_errors} items, "
            f"length bias {fmt(self.length_bias)}, position-swap disagreement {fmt(self.swap_disagreement)}"
            + (f", {self.infra_errors} infra errors" if self.infra_errors else "")
        )
        return figures + (f"; biased: {', '.join(self.fired)}" if self.fired else "")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fired": list(self.fired)}


def judge_checks_of(domain: Domain) -> JudgeChecks | None:
    """The bias checks a domain's judge declares (None: not a judge domain, or no checks)."""
    if not isinstance(domain, SourceDomain):
        return None
    v = domain.verifier
    if isinstance(v, (JudgeVerifier, JudgeEnsemble)):
        return v.params.checks
    return None


def check_judge(domain: Domain, difficulty: int) -> JudgeCheck | None:
    """Measure the judge of `domain` on its declared checks; None when it declares none."""
    checks = judge_checks_of(domain)
    if checks is None:
        return None
    labels = domain.verifier.labels  # type: ignore[attr-defined]  # a JudgeVerifier or JudgeEnsemble here
    judged: list[tuple[bool, float, bool, bool, float | None]] = []  # label, value, passed, padded, swap
    errors = 0
    for i in range(checks.items):
        task = domain.sample(i, "train", difficulty)
        for text in (labels.gold(task), labels.wrong(task)):
            if text is None:
                continue
            for padded in (False, True):
                got = _judge_one(domain, labels, task, checks.padding + text if padded else text)
                if got is None:
                    errors += 1
                    continue
                judged.append((got[0], got[1], got[2], padded, got[3]))
    return _summary(domain, checks, judged, errors)


def _judge_one(domain: Domain, labels: Any, task: Task, text: str) -> tuple[bool, float, bool, float | None] | None:
    """(label, judge reward, judge passed, swap disagreement) of one item; None on an infra error."""
    episode = Episode(text)
    try:
        label = bool(labels.score(task, episode).passed)
        score = domain.score(task, episode)
    except Exception:  # noqa: BLE001 - a judge that cannot answer is an infra error, counted apart
        return None
    return label, score.value, bool(score.passed), score.parts.get("swap_disagree")


def _summary(
    domain: Domain, checks: JudgeChecks, judged: list[tuple[bool, float, bool, bool, float | None]], errors: int
) -> JudgeCheck:
    n = len(judged)
    agree = sum(label == passed for label, _, passed, _, _ in judged)
    low, high = wilson(agree, n)
    padded = [v for _, v, _, p, _ in judged if p]
    concise = [v for _, v, _, p, _ in judged if not p]
    bias = sum(padded) / len(padded) - sum(concise) / len(concise) if padded and concise else None
    swaps = [s for *_, s in judged if s is not None]
    swap = sum(swaps) / len(swaps) if swaps else None
    fired = []
    if n and high < checks.min_agreement:
        fired.append("calibration")
    if bias is not None and abs(bias) > checks.max_length_bias:
        fired.append("length")
    if swap is not None and swap > checks.max_swap_disagreement:
        fired.append("position_swap")
    name = label(domain.verifier)
    return JudgeCheck(
        domain.name, name, n + errors, errors, agree / n if n else None, low, high, bias, swap, tuple(fired)
    )
