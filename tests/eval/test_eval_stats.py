"""Interval arithmetic against hand derivations."""

from __future__ import annotations

import math

import pytest

from posttrain.evaluate.stats import maj_at_k, mcnemar_p, paired_deltas, pass_at_k, wilson


def test_wilson_matches_hand_derivation():
    # k=8, n=10, z=1.96: centre = (0.8 + 1.9208/10) / 1.38416 = 0.71672;
    # half = 1.96*sqrt(0.016 + 0.009604)/1.38416 = 0.22656
    lo, hi = wilson(8, 10)
    assert lo == pytest.approx(0.49016, abs=2e-4) and hi == pytest.approx(0.94330, abs=2e-4)
    assert (
        wilson(0, 50)[0] == pytest.approx(0.0, abs=1e-12) and 0.06 < wilson(0, 50)[1] < 0.08
    )  # never a zero-width interval at 0
    assert wilson(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson(3, 2)


def test_pass_at_k_is_the_unbiased_estimator():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(8, 0, 8) == 0.0 and pass_at_k(8, 1, 8) == 1.0 and pass_at_k(5, 2, 1) == pytest.approx(0.4)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_maj_at_k_counts_ties_and_subsets():
    # answers a,a,b with a correct; k=1: 2/3; k=2: subsets {aa}=1, {ab}=1/2 twice -> (1 + .5 + .5)/3 = 2/3
    assert maj_at_k(["a", "a", "b"], [True, True, False], 1) == pytest.approx(2 / 3)
    assert maj_at_k(["a", "a", "b"], [True, True, False], 2) == pytest.approx(2 / 3)
    assert maj_at_k(["a", "a", "b"], [True, True, False], 3) == 1.0
    # many samples: Monte Carlo over seeded subsets stays close to the exact value
    answers = ["a"] * 12 + ["b"] * 12
    correct = [True] * 12 + [False] * 12
    assert abs(maj_at_k(answers, correct, 12) - 0.5) < 0.05


def test_mcnemar_exact():
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(4, 0) == pytest.approx(2 / 16)  # 2 * 0.5**4
    assert mcnemar_p(10, 0) == pytest.approx(2 / 1024)


def test_paired_deltas_mark_only_real_changes():
    ids = [f"t{i}" for i in range(60)]
    before = {"x": {i: False for i in ids}, "y": {i: j % 2 == 0 for j, i in enumerate(ids)}}
    after = {"x": {i: j < 30 for j, i in enumerate(ids)}, "y": {i: j % 2 == 1 for j, i in enumerate(ids)}}
    per, mean = paired_deltas(before, after)
    assert per["x"].delta == pytest.approx(0.5) and per["x"].significant and per["x"].low > 0
    # y: 30 items gained, 30 lost: delta 0, interval spans it
    assert per["y"].delta == 0 and not per["y"].significant and per["y"].low < 0 < per["y"].high
    assert mean.delta == pytest.approx(0.25) and mean.low <= 0.25 <= mean.high
    # infra errors (None) are left out of the pairs
    per, _ = paired_deltas({"z": {"a": None, "b": True}}, {"z": {"a": True, "b": True}})
    assert per["z"].n == 1
    # four improvements of four: interval above 0, but an exact test says it could be chance
    per, _ = paired_deltas({"w": {str(i): False for i in range(4)}}, {"w": {str(i): True for i in range(4)}})
    assert per["w"].low > 0 and not per["w"].significant and math.isclose(per["w"].p_value, 0.125)
