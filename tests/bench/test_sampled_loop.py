"""bench/sampled_loop.py: the coding loop's sampled figures from eval JSONs (per-item values),
the bootstrap over items, the pairing with the base, and the errors for files without them."""

from __future__ import annotations

import json

import pytest
from bench_loader import load

sl = load("sampled_loop")


def eval_json(path, per_item, budget=2, domain="pyfunc_revise"):
    items = {
        tid: {"pass1-by-turn@1": t1, f"pass1-by-turn@{budget}": last, f"converted-at-turn@{budget}": last - t1}
        for tid, (t1, last) in per_item.items()
    }
    res = {"turn_budget": budget, "sampling_items": items, "sampling": {f"converted-at-turn@{budget}": [0, 0, 0]}}
    path.write_text(json.dumps({"domains": {domain: res}}))
    return path


def test_figures_pair_the_last_turn_with_the_base_by_item_and_count_conversions(tmp_path):
    base = eval_json(tmp_path / "base.json", {"a": (0.0, 0.0), "b": (0.5, 0.5), "c": (1.0, 1.0), "d": (0.0, 0.25)})
    # the trained model: a up 0.5 (half of it at turn 2), b and c as before, d down 0.25
    model = eval_json(tmp_path / "s0.json", {"a": (0.25, 0.5), "b": (0.5, 0.5), "c": (1.0, 1.0), "d": (0.0, 0.0)})
    budget, b, _ = sl.load_items(base, "pyfunc_revise")
    _, m, _ = sl.load_items(model, "pyfunc_revise")
    r = sl.figures(b, m, budget, boot=2000, seed=0)
    assert r["items"] == 4 and r["converted_on"] == ["a"]
    assert r["converted"][0] == pytest.approx(0.25 / 4)
    assert r["gain"][0] == pytest.approx((0.5 + 0 + 0 - 0.25) / 4)  # paired: (after - before) per item
    assert r["turn1"][0] == pytest.approx(1.75 / 4) and r["last"][0] == pytest.approx(2.0 / 4)
    # a fresh attempt: (1 - p) x p per item (a: 0.75 x 0.25, b: 0.25, c and d: 0); the failed first turns
    # are 0.75 + 0.5 + 0 + 1 = 2.25 items' worth, 0.25 of them converted
    assert r["fresh"][0] == pytest.approx((0.1875 + 0.25) / 4)
    assert r["converted_given_failed"] == pytest.approx(0.25 / 2.25)
    for key in ("turn1", "last", "converted", "gain"):
        mean, lo, hi = r[key]
        assert lo <= mean <= hi
    # one item converting: a bootstrap over items reaches 0 (3 of 4 items resampled without it)
    assert r["converted"][1] == 0.0


def test_the_bootstrap_is_over_items_and_degenerate_when_every_item_agrees():
    # the script's intervals come from evaluate/stats.py's bootstrap, one "domain" of per-item values
    assert sl.mean_over_domains_interval({"x": [0.5] * 10}, 0, 500) == (0.5, 0.5)
    lo, hi = sl.mean_over_domains_interval({"x": [0.0] * 10 + [1.0] * 10}, 0, 4000)
    assert 0.25 < lo < 0.5 < hi < 0.75  # +-1.96 x 0.5/sqrt(20) = +-0.22
    lo, hi = sl.mean_over_domains_interval({"x": [0.0] * 23 + [0.25]}, 0, 4000)
    assert lo == 0.0 < hi  # one item of 24: resamples without it are common


def test_main_prints_a_row_per_trained_model(tmp_path, capsys):
    base = eval_json(tmp_path / "base.json", {"a": (0.0, 0.0), "b": (0.5, 0.5)})
    s0 = eval_json(tmp_path / "s0.json", {"a": (0.5, 0.75), "b": (0.5, 0.75)})
    s1 = eval_json(tmp_path / "s1.json", {"a": (0.0, 0.0), "b": (0.5, 0.5)})
    assert sl.main(["--base", str(base), "--trained", str(s0), str(s1), "--boot", "200"]) == 0
    out = capsys.readouterr().out
    assert "| s0 | 0.500 [0.500, 0.500] | 0.750 [0.750, 0.750] | 0.250 [0.250, 0.250] (2 of 2) | 0.500 |" in out
    assert "| 0.250 [0.250, 0.250] | +0.500" in out  # a fresh attempt converts 0.5 x 0.5
    assert "| s1 |" in out and "(0 of 2)" in out
    assert "converted mean 0.125 [min 0.000, max 0.250]" in out


def test_files_without_per_item_sampled_figures_get_a_clear_error(tmp_path):
    (tmp_path / "old.json").write_text(json.dumps({"domains": {"pyfunc_revise": {"turn_budget": 2, "sampling": {}}}}))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SystemExit, match="no sampled multi-turn figures per item"):
        sl.load_items(tmp_path / "old.json", "pyfunc_revise")
    with pytest.raises(SystemExit, match="cannot read"):
        sl.load_items(tmp_path / "bad.json", "pyfunc_revise")
    with pytest.raises(SystemExit, match="has no domain 'ifeval'"):
        sl.load_items(tmp_path / "old.json", "ifeval")
    base = eval_json(tmp_path / "base.json", {"a": (0.0, 0.0)})
    three = eval_json(tmp_path / "t3.json", {"a": (0.0, 0.0)}, budget=3)
    with pytest.raises(SystemExit, match="turn budget 3"):
        sl.main(["--base", str(base), "--trained", str(three)])
