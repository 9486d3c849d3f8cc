"""Interval arithmetic of evaluation: Wilson intervals, paired deltas, pass@k and maj@k.

Invariant: every function here is a pure function of its arguments (the
bootstrap takes its seed), so the same outcomes give the same figures twice;
an interval is (low, high) at 95% and always contains its point estimate.
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Z95 = 1.959963984540054
BOOTSTRAP = 2000


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval of k successes in n trials ((0, 1) when n is 0)."""
    if n <= 0:
        return (0.0, 1.0)
    if not 0 <= k <= n:
        raise ValueError(f"wilson: need 0 <= k <= n, got k={k}, n={n}")
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (0.0 if k == 0 else max(0.0, centre - half), 1.0 if k == n else min(1.0, centre + half))


def mean_interval(values: Sequence[float], z: float = Z95) -> tuple[float, float]:
    """Normal-approximation interval of the mean of per-item values in [0, 1], clipped to [0, 1]."""
    n = len(values)
    if n == 0:
        return (0.0, 1.0)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    half = z * math.sqrt(var / n)
    return (max(0.0, mean - half), min(1.0, mean + half))


def mcnemar_p(improved: int, regressed: int) -> float:
    """Exact two-sided McNemar p-value: the discordant pairs as Binomial(b + c, 1/2)."""
    m = improved + regressed
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, i) for i in range(min(improved, regressed) + 1)) / 2**m
    return min(1.0, 2 * tail)


@dataclass(frozen=True)
class PairedDelta:
    """after - before on the items both scored, with a paired bootstrap interval."""

    n: int
    before: float
    after: float
    delta: float
    low: float
    high: float
    improved: int
    regressed: int
    p_value: float | None
    """Exact McNemar p-value of one domain's pairs; None for the mean over domains (its interval decides)."""

    @property
    def significant(self) -> bool:
        """The interval excludes 0 and, for one domain, the exact McNemar test agrees (p < 0.05)."""
        return self.n > 0 and (self.low > 0 or self.high < 0) and (self.p_value is None or self.p_value < 0.05)


def _pairs(before: Mapping[str, bool | None], after: Mapping[str, bool | None]) -> tuple[list[int], list[int]]:
    keys = [k for k in before if k in after and before[k] is not None and after[k] is not None]
    return [int(bool(before[k])) for k in keys], [int(bool(after[k])) for k in keys]


def _percentiles(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    lo = xs[int(0.025 * (len(xs) - 1))]
    hi = xs[int(math.ceil(0.975 * (len(xs) - 1)))]
    return lo, hi


def paired_deltas(
    before: Mapping[str, Mapping[str, bool | None]],
    after: Mapping[str, Mapping[str, bool | None]],
    seed: int = 0,
    resamples: int = BOOTSTRAP,
) -> tuple[dict[str, PairedDelta], PairedDelta | None]:
    """Per domain (item id -> passed, None for an infra error) the paired delta, and
    the delta of the mean over domains (items resampled within each domain)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    per: dict[str, PairedDelta] = {}
    draws: list[Any] = []  # per domain: the bootstrap deltas
    for name in before:
        if name not in after:
            continue
        b, a = _pairs(before[name], after[name])
        if not b:
            per[name] = PairedDelta(0, 0.0, 0.0, 0.0, -1.0, 1.0, 0, 0, 1.0)
            continue
        diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
        boot = diff[rng.integers(0, len(diff), (resamples, len(diff)))].mean(axis=1)
        draws.append(boot)
        lo, hi = _percentiles(boot.tolist())
        delta = float(diff.mean())
        up, down = int((diff > 0).sum()), int((diff < 0).sum())
        per[name] = PairedDelta(
            len(b),
            sum(b) / len(b),
            sum(a) / len(a),
            delta,
            min(lo, delta),
            max(hi, delta),
            up,
            down,
            mcnemar_p(up, down),
        )
    scored = [d for d in per.values() if d.n]
    if not scored:
        return per, None
    mean_boot = np.mean(np.stack(draws), axis=0)
    lo, hi = _percentiles(mean_boot.tolist())
    delta = sum(d.delta for d in scored) / len(scored)
    mean = PairedDelta(
        sum(d.n for d in scored),
        sum(d.before for d in scored) / len(scored),
        sum(d.after for d in scored) / len(scored),
        delta,
        min(lo, delta),
        max(hi, delta),
        sum(d.improved for d in scored),
        sum(d.regressed for d in scored),
        None,
    )
    return per, mean


def mean_over_domains_interval(
    outcomes: Mapping[str, Sequence[float]], seed: int = 0, resamples: int = BOOTSTRAP
) -> tuple[float, float]:
    """Bootstrap interval of the mean of per-domain accuracies (items resampled within each domain;
    an item's outcome a pass or a value in [0, 1]). One domain: the bootstrap over items of a mean."""
    import numpy as np

    rng = np.random.default_rng(seed)
    arrays = [np.asarray(v, dtype=float) for v in outcomes.values() if len(v)]
    if not arrays:
        return (0.0, 1.0)
    boot = np.mean(np.stack([a[rng.integers(0, len(a), (resamples, len(a)))].mean(axis=1) for a in arrays]), axis=0)
    point = float(np.mean([a.mean() for a in arrays]))
    lo, hi = _percentiles(boot.tolist())
    return (min(lo, point), max(hi, point))


# ---------------------------------------------------------------- sampling metrics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one item with c correct of n samples (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


_EXACT_SUBSETS = 5000
_MC_SUBSETS = 2000


def _vote(answers: Sequence[str], correct: Sequence[bool], subset: Sequence[int]) -> float:
    """Majority vote of a subset: 1 if the correct answer wins, 1/t when it ties with t-1 others."""
    counts = Counter(answers[i] for i in subset)
    top = max(counts.values())
    winners = [a for a, c in counts.items() if c == top]
    right = {answers[i] for i in subset if correct[i]}
    return sum(a in right for a in winners) / len(winners)


def maj_at_k(answers: Sequence[str], correct: Sequence[bool], k: int, seed: int = 0) -> float:
    """Unbiased maj@k of one item: the expected majority-vote correctness of k samples drawn
    without replacement from its n; exact over all subsets when there are at most 5,000,
    else the mean over 2,000 seeded random subsets (still unbiased)."""
    n = len(answers)
    if not 1 <= k <= n or len(correct) != n:
        raise ValueError(f"maj_at_k: need 1 <= k <= n answers with one verdict each, got n={n}, k={k}")
    if math.comb(n, k) <= _EXACT_SUBSETS:
        subsets = list(itertools.combinations(range(n), k))
    else:
        rng = random.Random(seed)
        subsets = [rng.sample(range(n), k) for _ in range(_MC_SUBSETS)]
    return sum(_vote(answers, correct, s) for s in subsets) / len(subsets)
