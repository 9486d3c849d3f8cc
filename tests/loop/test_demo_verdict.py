"""The one-line verdict `make demo` ends with: PASS only when the held-out gain and every domain hold."""

from __future__ import annotations

import json

from posttrain.model.demo import main, verdict


def test_pass_names_the_figures():
    ok, line = verdict({"add": 0.2, "sort": 0.1}, {"add": 0.6, "sort": 0.3})
    assert ok and line == (
        "demo: PASS held-out mean 0.15 -> 0.45 (+0.30), 2/2 domains improved, no domain fell more than 2 points"
    )


def test_small_gain_fails_with_why():
    ok, line = verdict({"add": 0.2, "sort": 0.1}, {"add": 0.3, "sort": 0.2})
    assert not ok and line.startswith("demo: FAIL") and "gain +0.10 is below the demo's +0.20" in line


def test_a_falling_domain_fails_even_with_a_large_mean_gain():
    ok, line = verdict({"add": 0.2, "mul": 0.30, "sort": 0.1}, {"add": 0.9, "mul": 0.27, "sort": 0.9})
    assert not ok and "fell more than 2 points: mul 0.30 -> 0.27" in line and "1/3" not in line and "2/3" in line
    assert verdict({"add": 0.2, "mul": 0.30}, {"add": 0.9, "mul": 0.29})[0]  # one point down is within the margin


def test_cli_reads_the_run_and_sets_the_exit_code(tmp_path, capsys):
    table = lambda accs: {"mean_accuracy": 0, "domains": {d: {"accuracy": a} for d, a in accs.items()}}  # noqa: E731
    (tmp_path / "eval.json").write_text(json.dumps({"before": table({"add": 0.1}), "after": table({"add": 0.5})}))
    assert main([str(tmp_path)]) == 0 and capsys.readouterr().out.startswith("demo: PASS")
    (tmp_path / "eval.json").write_text(json.dumps({"before": table({"add": 0.1}), "after": None}))
    assert main([str(tmp_path)]) == 1 and "no after-training evaluation" in capsys.readouterr().out
    assert main([str(tmp_path / "missing")]) == 1 and "no evaluation table" in capsys.readouterr().out


def test_an_infra_only_domain_fails_and_the_gain_interval_is_shown(tmp_path, capsys):
    table = lambda accs: {"domains": {d: {"accuracy": a} for d, a in accs.items()}}  # noqa: E731
    run = {
        "before": table({"add": 0.1, "sort": 0.2}),
        "after": table({"add": 0.7, "sort": 0.8}),
        "deltas": {"mean": {"delta": 0.6, "ci": [0.5, 0.7]}},
    }
    (tmp_path / "eval.json").write_text(json.dumps(run))
    assert main([str(tmp_path)]) == 0 and "(95% interval of the gain +0.50 to +0.70)" in capsys.readouterr().out
    run["after"]["domains"]["sort"]["accuracy"] = None
    (tmp_path / "eval.json").write_text(json.dumps(run))
    assert main([str(tmp_path)]) == 1 and "no held-out accuracy for sort" in capsys.readouterr().out


def test_demo_real_asks_its_own_gain_and_prints_the_benchmarks_before_and_after(tmp_path, capsys):
    table = lambda accs: {"domains": {d: {"accuracy": a} for d, a in accs.items()}}  # noqa: E731
    (tmp_path / "eval.json").write_text(json.dumps({"before": table({"add": 0.1}), "after": table({"add": 0.27})}))
    assert main([str(tmp_path)]) == 1  # +0.17: below make demo's +0.20
    capsys.readouterr()
    bench = lambda acc, lo, hi: {"domains": {"gsm8k": {"accuracy": acc, "ci": [lo, hi], "n": 20}}}  # noqa: E731
    (tmp_path / "b.json").write_text(json.dumps(bench(0.05, 0.01, 0.24)))
    (tmp_path / "a.json").write_text(json.dumps(bench(0.0, 0.0, 0.16)))
    args = [str(tmp_path), "--min-gain", "0.15", "--bench", str(tmp_path / "b.json"), str(tmp_path / "a.json")]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "benchmark gsm8k: 0.05 [0.01, 0.24] (n=20) -> 0.00 [0.00, 0.16] (n=20)"  # forgetting shown
    assert out[1].startswith("demo: PASS") and "(+0.17)" in out[1]
    args[-1] = str(tmp_path / "missing.json")
    assert main(args) == 0 and "benchmarks: no table at" in capsys.readouterr().out  # shown, not a criterion
