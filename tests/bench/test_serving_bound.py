"""bench/serving.py costs: speculation's bound from measured forward costs (issue 38)."""

from __future__ import annotations

import pytest
from bench_loader import load

sv = load("serving")


@pytest.mark.parametrize("n", [2, 4, 8, 64])
@pytest.mark.parametrize("a", [0.1, 0.5, 0.9, 0.99])
def test_per_token_inverts_the_mean_accepted_length(n, a):
    assert sv.per_token((1 - a**n) / (1 - a), n) == pytest.approx(a, abs=1e-9)


def test_the_bound_says_what_a_target_needs_and_when_it_is_out_of_reach(capsys):
    # a verifying forward of 4 tokens costing 2x a step: all accepted gives 2x; 1.5x needs 3 of 4
    sv.speculation_bound({1: 0.010, 4: 0.020, 8: 0.080}, 1.5)
    out = capsys.readouterr().out
    assert "n=  4 (3 drafts): every draft accepted  2.00x; 1.5x needs  3.00 of 4 tokens a forward" in out
    assert f"accepted at >= {sv.per_token(3.0, 4):.2f}" in out
    assert "n=  8 (7 drafts): every draft accepted  1.00x; 1.5x needs 12.00 of 8" in out and "out of reach" in out
    assert "at a mean accepted length of 3: at most 1.50x" in out
