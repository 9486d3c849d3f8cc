"""Task-set hygiene: dedupe, contamination report, eval rotation."""

from __future__ import annotations

import pytest

from posttrain.domains.hygiene import contamination, dedupe, eval_indices, normalise, prompt_key
from posttrain.domains.registry import get
from posttrain.types import Message, Task, TaskMeta


def mk(text: str, i: int = 0) -> Task:
    return Task(f"t{i}", "x", (Message("user", text),), "", TaskMeta("train", 1, "test", "v"))


def test_dedupe_exact_and_normalised():
    rep = dedupe([mk("What is 2+2?"), mk("What is 2+2?"), mk("what  is 2+2?"), mk("What is 2+3?")])
    assert (rep.total, rep.exact_duplicates, rep.normalised_duplicates, len(rep.kept)) == (4, 1, 1, 2)


def test_normalisation_keeps_numbers_apart():
    assert prompt_key(mk("Add 12 and 3")) != prompt_key(mk("Add 1 2 and 3"))
    assert normalise("  A\nb\tC ") == "a b c"


def test_contamination_flags_planted_overlap_and_not_disjoint_sets():
    train = [mk(f"the quick brown fox number {i} jumps over the lazy dog", i) for i in range(20)]
    clean = [mk(f"completely different words appear here in item {i} today", i) for i in range(5)]
    planted = clean + [mk("the quick brown fox number 3 jumps over the lazy dog", 99)]
    assert contamination("x", train, clean).contaminated == 0
    rep = contamination("x", train, planted, n=4)
    assert rep.contaminated == 1 and rep.exact_overlap == 1 and rep.max_overlap == 1.0


def test_real_domain_has_no_exact_train_eval_overlap():
    d = get("math_gcd")
    train = [d.sample(i, "train", 2) for i in range(300)]
    eval_ = [d.sample(i, "eval", 2) for i in range(50)]
    rep = contamination("math_gcd", train, eval_)
    assert rep.exact_overlap == 0
    assert rep.contaminated == 0  # the shared template text is not counted as overlap


def test_eval_rotation_is_disjoint():
    assert set(eval_indices(10, 0)).isdisjoint(eval_indices(10, 1))
    assert list(eval_indices(3, 2)) == [6, 7, 8]
    with pytest.raises(ValueError):
        eval_indices(-1)
