"""Alarm detectors: small named classes reading the monitor's history.

Invariant: a detector is a pure function of the history it is given (no
clock, no randomness), returns one Hit per (alarm, domain) whose condition
holds now, and never fires before it has the steps or evaluations its rule
needs (a baseline and a recent window that do not overlap).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from posttrain.configs.monitor import AlarmsConfig
from posttrain.monitor.signals import DomainSignals
from posttrain.tasks.drift import drop_margin


@dataclass(frozen=True)
class Hit:
    kind: str
    domain: str | None
    message: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class History:
    """What the monitor has seen: per-domain signals by step, KL, evaluations, audits."""

    signals: dict[str, list[tuple[int, DomainSignals]]] = field(default_factory=dict)
    kl: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    evals: list[tuple[int, dict[str, float]]] = field(default_factory=list)
    eval_counts: list[dict[str, int]] = field(default_factory=list)
    """Items behind each accuracy of `evals` (same order); empty where unknown."""
    audits: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)

    def count(self, domain: str) -> int:
        return len(self.signals.get(domain, ()))

    def first(self, domain: str, name: str, n: int) -> list[float]:
        """The signal's first n values (a slice: checks stay O(window) however long the run)."""
        return [getattr(s, name) for _, s in self.signals.get(domain, [])[:n]]

    def last(self, domain: str, name: str, n: int) -> list[float]:
        return [getattr(s, name) for _, s in self.signals.get(domain, [])[-n:]]


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


class Detector(Protocol):
    kind: str

    def check(self, h: History, cfg: AlarmsConfig) -> list[Hit]: ...


class _Collapse:
    """A signal falling below ratio x its baseline in a domain that is not solved."""

    kind = ""
    signal = ""
    label = ""

    def check(self, h: History, cfg: AlarmsConfig) -> list[Hit]:
        rule = getattr(cfg, self.kind)
        hits = []
        for domain in h.signals:
            if h.count(domain) < cfg.baseline_steps + cfg.window:
                continue
            base = _mean(h.first(domain, self.signal, cfg.baseline_steps))
            recent = _mean(h.last(domain, self.signal, cfg.window))
            reward = _mean(h.last(domain, "reward_mean", cfg.window))
            if base > 0 and recent < rule.ratio * base and reward < rule.solved_at:
                hits.append(
                    Hit(
                        self.kind,
                        domain,
                        f"{self.label} collapse in {domain}: {recent:.3f} over the last {cfg.window} steps, "
                        f"{recent / base:.0%} of its start {base:.3f}, while reward is {reward:.2f}",
                        {"baseline": base, "recent": recent, "reward": reward},
                    )
                )
        return hits


class EntropyCollapse(_Collapse):
    kind, signal, label = "entropy_collapse", "entropy", "entropy"


class DiversityCollapse(_Collapse):
    kind, signal, label = "diversity_collapse", "distinct_answers", "diversity (distinct answers per group)"


class LengthExplosion:
    kind = "length_explosion"

    def check(self, h: History, cfg: AlarmsConfig) -> list[Hit]:
        rule, hits = cfg.length_explosion, []
        for domain in h.signals:
            if h.count(domain) < cfg.baseline_steps + cfg.window:
                continue
            base, recent = (
                _mean(h.first(domain, "length_mean", cfg.baseline_steps)),
                _mean(h.last(domain, "length_mean", cfg.window)),
            )
            t_base, t_recent = (
                _mean(h.first(domain, "truncated_share", cfg.baseline_steps)),
                _mean(h.last(domain, "truncated_share", cfg.window)),
            )
            grew = base > 0 and recent > rule.factor * base
            truncating = t_recent > rule.truncated_share and t_base < rule.truncated_share / 2
            if grew or truncating:
                hits.append(
                    Hit(
                        self.kind,
                        domain,
                        f"length explosion in {domain}: mean length {base:.1f} -> {recent:.1f} tokens, "
                        f"truncated {t_base:.0%} -> {t_recent:.0%}",
                        {"baseline": base, "recent": recent, "truncated_baseline": t_base, "truncated": t_recent},
                    )
                )
        return hits


class KLAcceleration:
    kind = "kl_acceleration"

    def check(self, h: History, cfg: AlarmsConfig) -> list[Hit]:
        rule, hits = cfg.kl_acceleration, []
        w = rule.window
        for domain, points in h.kl.items():
            xs = [v for _, v in points[-3 * w :]]
            if len(xs) < 3 * w:
                continue
            a, b, c = _mean(xs[-3 * w : -2 * w]), _mean(xs[-2 * w : -w]), _mean(xs[-w:])
            before, now = max(b - a, rule.min_growth * b), c - b
            if c > rule.min_kl and now > rule.factor * before:
                where = "overall" if domain == "all" else f"in {domain}"
                hits.append(
                    Hit(
                        self.kind,
                        None if domain == "all" else domain,
                        f"KL acceleration {where}: KL {a:.3f} -> {b:.3f} -> {c:.3f} over windows of "
                        f"{w} measurements (growth {now:.3f} against {b - a:.3f} before)",
                        {"windows": [a, b, c]},
                    )
                )
        return hits


class AuditFailure:
    kind = "audit_failure"

    def check(self, h: History, cfg: AlarmsConfig) -> list[Hit]:
        rule, hits = cfg.audit_failure, []
        for domain, rows in h.audits.items():
            recent = rows[-cfg.window :]
            audited, failed = sum(r[1] for r in recent), sum(r[2] for r in recent)
            if audited >= rule.min_audited and failed / audited > rule.max_fail_share:
                hits.append(
                    Hit(
                        self.kind,
                        domain,
                        f"audit failure in {domain}: {failed} of {audited} top-reward rollouts of the last "
                        f"{len(recent)} steps fail the stricter check (reward hacking?)",
                        {"audited": audited, "failed": failed},
                    )
                )
        return hits


class JudgeDrift:
    """A judge domain's reward rising over its baseline by `rise` more than the programmatic shadow
    score of the same rollouts (the judge's `checks.labels` verifier, the part `programmatic`) did:
    a judge and a programmatic check that agree rise together and never fire it."""

    kind = "judge_drift"

    def check(self, h: History, cfg: AlarmsConfig) -> list[Hit]:
        rule, hits = cfg.judge_drift, []
        for domain, points in h.signals.items():
            shadowed = [s for _, s in points if s.programmatic_mean is not None]
            if len(shadowed) < cfg.baseline_steps + cfg.window:
                continue
            first, last = shadowed[: cfg.baseline_steps], shadowed[-cfg.window :]
            j0, j1 = _mean([s.reward_mean for s in first]), _mean([s.reward_mean for s in last])
            p0, p1 = (
                _mean([s.programmatic_mean or 0.0 for s in first]),
                _mean([s.programmatic_mean or 0.0 for s in last]),
            )
            if (j1 - j0) - (p1 - p0) >= rule.rise:
                hits.append(
                    Hit(
                        self.kind,
                        domain,
                        f"judge drift in {domain}: the judge's reward went {j0:.2f} -> {j1:.2f} while the "
                        f"programmatic score of the same rollouts went {p0:.2f} -> {p1:.2f} (the policy may be "
                        "learning what the judge likes)",
                        {
                            "judge_baseline": j0,
                            "judge_recent": j1,
                            "programmatic_baseline": p0,
                            "programmatic_recent": p1,
                        },
                    )
                )
        return hits


STEP_DETECTORS: tuple[Detector, ...] = (
    EntropyCollapse(),
    DiversityCollapse(),
    LengthExplosion(),
    KLAcceleration(),
    AuditFailure(),
    JudgeDrift(),
)


# ---------------------------------------------------------------- evaluation-time detectors


class RewardHacking:
    """Train reward rising over its baseline while held-out accuracy has not moved up."""

    kind = "reward_hacking"

    def check(self, h: History, cfg: AlarmsConfig) -> list[Hit]:
        rule, hits = cfg.reward_hacking, []
        if len(h.evals) < 2:
            return hits
        (_, first), (step, last) = h.evals[0], h.evals[-1]
        for domain in last:
            if domain not in first or h.count(domain) < cfg.baseline_steps + cfg.window:
                continue
            base = _mean(h.first(domain, "reward_mean", cfg.baseline_steps))
            recent = _mean(h.last(domain, "reward_mean", cfg.window))
            gain = last[domain] - first[domain]
            if recent - base >= rule.rise and gain <= rule.stall:
                hits.append(
                    Hit(
                        self.kind,
                        domain,
                        f"reward hacking suspected in {domain}: train reward {base:.2f} -> {recent:.2f} "
                        f"while held-out accuracy went {first[domain]:.2f} -> {last[domain]:.2f} by step {step}",
                        {
                            "train_baseline": base,
                            "train_recent": recent,
                            "heldout_first": first[domain],
                            "heldout_last": last[domain],
                        },
                    )
                )
        return hits


class DomainRegression:
    """A domain below its best held-out accuracy while the others' mean has gained."""

    kind = "domain_regression"

    def check(self, h: History, cfg: AlarmsConfig) -> list[Hit]:
        tol, hits = cfg.domain_regression.tolerance, []
        if len(h.evals) < 2:
            return hits
        first, (step, last) = h.evals[0][1], h.evals[-1]
        counts = h.eval_counts if len(h.eval_counts) == len(h.evals) else [{} for _ in h.evals]
        for domain, now in last.items():
            best, i = max((acc[domain], i) for i, (_, acc) in enumerate(h.evals) if domain in acc)
            others = [d for d in last if d != domain and d in first]
            if not others:
                continue
            gain = _mean([last[d] - first[d] for d in others])
            noise = drop_margin(best, counts[i].get(domain), now, counts[-1].get(domain), cfg.domain_regression.z)
            if best - now > max(tol, noise) and gain > tol:
                hits.append(
                    Hit(
                        self.kind,
                        domain,
                        f"{domain} regressed on held-out to {now:.2f} (best {best:.2f}) while the other "
                        f"domains gained {gain:+.2f} on average by step {step}",
                        {"now": now, "best": best, "others_gain": gain},
                    )
                )
        return hits


EVAL_DETECTORS: tuple[Detector, ...] = (RewardHacking(), DomainRegression())
