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


def loop_and_control(path, loop, ctl, repeated=None):
    """An eval JSON holding pyfunc_revise and its control pyfunc_retry, items keyed as the eval keys
    them (domain:split:level:index); `repeated`: (loop, control) per item or None (older files)."""
    doms = {}
    for k, (dom, per) in enumerate((("pyfunc_revise", loop), ("pyfunc_retry", ctl))):
        items = {}
        for i, (t1, last) in enumerate(per):
            v = {"pass1-by-turn@1": t1, "pass1-by-turn@2": last, "converted-at-turn@2": last - t1}
            if repeated is not None:
                v["repeated-at-turn@2"] = repeated[i][k]
            items[f"{dom}:eval:2:{i}"] = v
        doms[dom] = {"turn_budget": 2, "sampling_items": items, "sampling": {}}
    path.write_text(json.dumps({"domains": doms}))
    return path


def test_control_pairs_the_loop_with_its_control_by_item_across_domain_names(tmp_path):
    # item 0 converts 0.5 with the failure's text, 0.25 without; item 1 converts 0 in both; item 2 0.25 in both
    f = loop_and_control(
        tmp_path / "s0.json",
        [(0.0, 0.5), (0.5, 0.5), (0.25, 0.5)],
        [(0.0, 0.25), (0.5, 0.5), (0.25, 0.5)],
        repeated=[(0.25, 0.5), (0.5, 0.5), (0.0, 0.25)],
    )
    _, loop, _ = sl.load_items(f, "pyfunc_revise")
    _, ctl, _ = sl.load_items(f, "pyfunc_retry")
    r = sl.control(loop, ctl, 2, boot=2000, seed=0)
    assert r["items"] == 3
    assert r["converted"][0] == pytest.approx(0.75 / 3) and r["converted_control"][0] == pytest.approx(0.5 / 3)
    assert r["difference"][0] == pytest.approx(0.25 / 3)  # per item: 0.25, 0, 0
    assert r["difference"][1] == 0.0 <= r["difference"][2]  # one item of three differs: resamples without it
    assert r["turn1"][0] == r["turn1_control"][0] == pytest.approx(0.75 / 3)
    assert r["repeated"][0] == pytest.approx(0.75 / 3) and r["repeated_control"][0] == pytest.approx(1.25 / 3)
    # files without the repeat figures: no repeat column, the rest unchanged
    old = loop_and_control(tmp_path / "old.json", [(0.0, 0.5)], [(0.0, 0.25)])
    _, loop, _ = sl.load_items(old, "pyfunc_revise")
    _, ctl, _ = sl.load_items(old, "pyfunc_retry")
    assert "repeated" not in sl.control(loop, ctl, 2, boot=200, seed=0)


def test_main_prints_the_control_table_and_refuses_files_without_the_control(tmp_path, capsys):
    base = loop_and_control(tmp_path / "base.json", [(0.0, 0.25)], [(0.0, 0.25)], repeated=[(0.75, 0.75)])
    s0 = loop_and_control(tmp_path / "s0.json", [(0.0, 0.5)], [(0.0, 0.0)], repeated=[(0.25, 1.0)])
    args = ["--base", str(base), "--trained", str(s0), "--boot", "200", "--control", "pyfunc_retry"]
    assert sl.main(args) == 0
    out = capsys.readouterr().out
    assert "| base | 0.000 / 0.000 | 0.250 [0.250, 0.250] | 0.250 [0.250, 0.250] | +0.000 [+0.000, +0.000] |" in out
    assert "| s0 | 0.000 / 0.000 | 0.500 [0.500, 0.500] | 0.000 [0.000, 0.000] | +0.500 [+0.500, +0.500] |" in out
    assert "0.250 / 1.000 |" in out
    assert "repeats the attempt in 0.250 of samples (0.250 of the failed first turns)" in out
    lone = eval_json(tmp_path / "lone.json", {"pyfunc_revise:eval:2:0": (0.0, 0.5)})
    with pytest.raises(SystemExit, match="has no domain 'pyfunc_retry'"):
        sl.main(["--base", str(base), "--trained", str(lone), "--boot", "200", "--control", "pyfunc_retry"])
