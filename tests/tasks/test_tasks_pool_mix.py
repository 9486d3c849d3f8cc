"""The pool's mix: glob patterns in tasks.domains, and a weight change that
takes effect without starving the other domains."""

from __future__ import annotations

from collections import Counter

import pytest

from posttrain.configs.tasks import TasksConfig
from posttrain.domains.registry import all_domains
from posttrain.errors import TaskError
from posttrain.tasks.pool import TaskPool


def _pool(domains: dict) -> TaskPool:
    return TaskPool(TasksConfig.model_validate({"domains": domains}), seed=0)


def test_pattern_expands_and_explicit_name_overrides():
    pool = _pool({"rg_*": {"weight": 1.0}, "add": {"weight": 2.0, "difficulty": 1}, "rg_ab": {"weight": 3.0}})
    rg = [n for n in all_domains() if n.startswith("rg_")]
    assert set(pool.names) == set(rg) | {"add"}
    assert pool.weight("rg_ab") == 3.0 and pool.weight(rg[-1]) == 1.0 and pool.weight("add") == 2.0


def test_star_takes_every_domain_and_caps_a_pattern_difficulty():
    pool = _pool({"*": {"difficulty": 3}})
    assert set(pool.names) == {n for n, d in all_domains().items() if d.trains}  # not the image families
    assert {n for n, d in all_domains().items() if not d.trains} >= {"chart", "ui", "drawing"}
    for name in pool.names:
        assert pool.eval_difficulty(name) == min(3, pool.domains[name].levels)


def test_pattern_matching_nothing_is_an_error():
    with pytest.raises(TaskError, match="matches no registered domain"):
        _pool({"nosuch_*": {}})


def test_weight_change_does_not_starve_the_others():
    pool = _pool({n: {"difficulty": 1} for n in ("add", "sub", "mul", "reverse", "sort")})
    pool.draw(500)  # 100 each
    pool.set_weight("mul", 4.0)  # mul's share: 1/5 -> 1/2
    nxt = Counter(t.domain for t in pool.draw(80))
    # the new shares apply at once: about 40 mul, 10 of each other, never 80 mul in a row
    assert 38 <= nxt["mul"] <= 42
    assert all(8 <= nxt[d] <= 12 for d in ("add", "sub", "reverse", "sort")), nxt


def test_set_weight_rejects_bad_values():
    pool = _pool({"add": {}})
    with pytest.raises(TaskError, match="positive finite"):
        pool.set_weight("add", 0.0)
    with pytest.raises(TaskError, match="not in this pool"):
        pool.set_weight("sub", 1.0)
