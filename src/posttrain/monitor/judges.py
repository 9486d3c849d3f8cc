"""Bias checks of an LLM judge, run before training (issue 28 item 2, issue 35 item 4).

Invariant: a check reads the judge only through the domain's own verifier, on
train rows of that domain, and labels every item with the judge's programmatic
`checks.labels` verifier (never with an assumed label). Per row: the labels
verifier's gold and wrong answers, each concise and padded with the same prose
before it (the base items), and the wrong answer with each content trigger
(`checks.triggers`: a fixed phrase after it, the gold's layout around it), kept
only while the labels verifier still labels it wrong. From the base items it
measures the judge's agreement with the labels (with its 95% Wilson interval;
an abstention counts as the 0 it is scored), its length bias (mean reward of the
padded forms minus the concise ones) and, for pairwise judges, the share of
items whose two orders disagree (the `swap_disagree` part); from the triggered
items, per trigger, the mean reward it adds to the same wrong answer (the
largest is the content bias); over every item, the gap between its abstention
rates on items labelled right and on items labelled wrong (the abstention
skew: a judge that declines exactly the answers it would grade wrong abstains
on one side only). An item the judge cannot score (an infra error: the judge
down, an HTTP error, a timeout) is counted apart, never as a disagreement; a
check with no scored item is reported as not measured and does not fire.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from posttrain.byo.domain import SourceDomain
from posttrain.byo.models import ABSTAINED, JudgeEnsemble, JudgeVerifier
from posttrain.configs.byo import JudgeChecks
from posttrain.contracts.verifier import label
from posttrain.domains.base import Domain
from posttrain.evaluate.stats import wilson
from posttrain.types import Episode, Task


@dataclass(frozen=True)
class _Item:
    """One judged item: its label, the judge's reward and pass, whether it is padded, its
    trigger ('' for a base item) and base (the wrong answer's reward without the trigger), its
    swap disagreement and whether the judge abstained."""

    label: bool
    value: float
    passed: bool
    padded: bool
    swap: float | None
    abstained: bool
    trigger: str = ""
    base: float | None = None


@dataclass(frozen=True)
class JudgeCheck:
    """One judge domain's bias figures at run start, and which checks fired."""

    domain: str
    verifier: str
    items: int
    """Items judged (base and triggered), infra errors included."""
    infra_errors: int
    agreement: float | None
    agreement_low: float
    agreement_high: float
    length_bias: float | None
    swap_disagreement: float | None
    """None for a pointwise judge (no positions to swap)."""
    fired: tuple[str, ...]
    """Names of the checks past their thresholds: calibration, length, position_swap, content,
    abstention."""
    abstentions: int = 0
    """Items the judge answered without a verdict (scored 0, as in training)."""
    abstention_skew: float | None = None
    """Abstention rate on the items labelled wrong minus that on the items labelled right (None:
    one side has no item)."""
    content_bias: dict[str, float] = field(default_factory=dict)
    """Per trigger: mean reward of the wrong answers carrying it minus the same answers without it."""

    def message(self) -> str:
        def fmt(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.2f}"

        worst = max(self.content_bias.items(), key=lambda kv: kv[1], default=None)
        figures = (
            f"judge {self.verifier} on {self.domain}: agreement with programmatic labels {fmt(self.agreement)} "
            f"[{self.agreement_low:.2f}, {self.agreement_high:.2f}] over {self.items - self.infra_errors} items, "
            f"length bias {fmt(self.length_bias)}, position-swap disagreement {fmt(self.swap_disagreement)}, "
            f"content bias {'n/a' if worst is None else f'{worst[1]:.2f} ({worst[0]})'}, "
            f"abstentions {self.abstentions} (skew {fmt(self.abstention_skew)})"
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
    judged: list[_Item] = []
    errors = 0
    for i in range(checks.items):
        task = domain.sample(i, "train", difficulty)
        gold, wrong = labels.gold(task), labels.wrong(task)
        base: _Item | None = None  # the concise wrong answer, which the triggers are added to
        for is_wrong, text in ((False, gold), (True, wrong)):
            if text is None:
                continue
            for padded in (False, True):
                got = _judge_one(domain, labels, task, checks.padding + text if padded else text, padded)
                errors += got is None
                judged += [got] if got is not None else []
                if is_wrong and not padded and got is not None and not got.label:
                    base = got
        if base is None or wrong is None:
            continue
        for name, text in _triggered(checks, labels, gold, wrong).items():
            got = _judge_one(domain, labels, task, text, False, name, base.value)
            errors += got is None
            judged += [got] if got is not None and not got.label else []
    return _summary(domain, checks, judged, errors)


def _triggered(checks: JudgeChecks, labels: Any, gold: str | None, wrong: str) -> dict[str, str]:
    """Each trigger's text for the wrong answer `wrong` (the reference layout only where the gold
    has one beyond its answer)."""
    layout = ""
    if gold is not None:
        core, wrong_core = labels.text(Episode(gold)), labels.text(Episode(wrong))
        if core and core in gold and gold.strip() != core.strip():
            layout = gold.replace(core, wrong_core)
    layout = "" if layout == wrong else layout  # the wrong answer already has the gold's layout
    out = {}
    for name, template in checks.triggers.items():
        if "{reference_format}" in template and not layout:
            continue
        out[name] = template.replace("{reference_format}", layout).replace("{answer}", wrong)
    return out


def _judge_one(
    domain: Domain, labels: Any, task: Task, text: str, padded: bool, trigger: str = "", base: float | None = None
) -> _Item | None:
    """One judged item; None on an infra error (the judge down, an HTTP error, a timeout)."""
    episode = Episode(text)
    try:
        label = bool(labels.score(task, episode).passed)
        score = domain.score(task, episode)
    except Exception:  # noqa: BLE001 - a judge that cannot answer is an infra error, counted apart
        return None
    abstained = bool(score.parts.get(ABSTAINED, 0.0))
    swap = score.parts.get("swap_disagree")
    return _Item(label, score.value, bool(score.passed), padded, swap, abstained, trigger, base)


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _summary(domain: Domain, checks: JudgeChecks, judged: list[_Item], errors: int) -> JudgeCheck:
    core = [j for j in judged if not j.trigger]
    n = len(core)
    agree = sum(j.label == j.passed for j in core)
    low, high = wilson(agree, n)
    padded, concise = _mean([j.value for j in core if j.padded]), _mean([j.value for j in core if not j.padded])
    bias = padded - concise if padded is not None and concise is not None else None
    swap = _mean([j.swap for j in core if j.swap is not None])
    content = {}
    for name in checks.triggers:
        gains = [j.value - j.base for j in judged if j.trigger == name and j.base is not None]
        if gains:
            content[name] = round(sum(gains) / len(gains), 6)
    on_wrong = _mean([float(j.abstained) for j in judged if not j.label])
    on_right = _mean([float(j.abstained) for j in judged if j.label])
    skew = on_wrong - on_right if on_wrong is not None and on_right is not None else None
    fired = []
    if n and high < checks.min_agreement:
        fired.append("calibration")
    if bias is not None and abs(bias) > checks.max_length_bias:
        fired.append("length")
    if swap is not None and swap > checks.max_swap_disagreement:
        fired.append("position_swap")
    if any(gain > checks.max_content_bias for gain in content.values()):
        fired.append("content")
    if skew is not None and abs(skew) > checks.max_abstention_skew:
        fired.append("abstention")
    name = label(domain.verifier)
    abstentions = sum(j.abstained for j in judged)
    return JudgeCheck(
        domain.name,
        name,
        len(judged) + errors,
        errors,
        agree / n if n else None,
        low,
        high,
        bias,
        swap,
        tuple(fired),
        abstentions,
        skew,
        content,
    )
