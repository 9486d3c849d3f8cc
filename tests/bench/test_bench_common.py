"""bench/common.py: the `--domains` value the serving and speculative-rollout benches both read."""

from __future__ import annotations

import pytest
from bench_loader import load


def test_domain_levels_reads_the_value_and_names_a_bad_one():
    common = load("common")
    assert common.domain_levels("pyfunc_revise:1,ifeval:2") == {"pyfunc_revise": 1, "ifeval": 2}
    assert common.domain_levels(" add:3") == {"add": 3}
    for bad in ("add", "add:x", "add:1,", ":1", "add:1:2"):
        with pytest.raises(SystemExit, match="--domains"):
            common.domain_levels(bad)
