"""`posttrain release`: checkpoints into the registry, with the int8 quality gate."""

from __future__ import annotations

import json

from serve_helpers import save_model

from posttrain.cli import main
from posttrain.serve.registry import ModelRegistry


def _run_dir(tmp_path, steps=(1, 2)):
    for s in steps:
        ck = save_model(tmp_path / "run" / "checkpoints" / f"step_{s:08d}", "micro", seed=s)
        (ck / "meta.json").write_text(json.dumps({"format": 1, "step": s}))
    return tmp_path / "run"


def test_release_latest_then_canary(tmp_path, capsys):
    run = _run_dir(tmp_path)
    reg = tmp_path / "reg"
    assert main(["release", str(run), "--registry", str(reg), "--step", "1"]) == 0
    assert main(["release", str(run), "--registry", str(reg), "--share", "0.25"]) == 0
    state = ModelRegistry(reg).state()
    assert (state.stable, state.canary, state.canary_share) == ("v1", "v2", 0.25)
    assert ModelRegistry(reg).version("v2").source.endswith("step_00000002")
    assert not list((reg / "versions" / "v2").glob("optimizer*"))


def test_release_int8_gate_records_verdict(tmp_path, capsys):
    run = _run_dir(tmp_path, steps=(1,))
    assert (
        main(
            [
                "release",
                str(run),
                "--registry",
                str(tmp_path / "reg"),
                "--fast-mode",
                "int8",
                "--gate-domains",
                "reverse",
                "--gate-tasks",
                "4",
            ]
        )
        == 0
    )
    info = ModelRegistry(tmp_path / "reg").version("v1")
    assert set(info.gate["standard"]) == {"reverse"} and "delta" in info.gate
    assert info.fast_mode == ("int8" if info.gate["passed"] else "lossless")


def test_release_errors_name_the_problem(tmp_path, capsys):
    assert main(["release", str(tmp_path), "--registry", str(tmp_path / "reg")]) == 2
    assert "has no checkpoints" in capsys.readouterr().err
    run = _run_dir(tmp_path, steps=(1,))
    assert main(["release", str(run), "--registry", str(tmp_path / "reg"), "--step", "7"]) == 2
    assert "--step 7" in capsys.readouterr().err


def test_gate_fails_when_the_lossy_tier_drops_more_than_a_point(tmp_path, monkeypatch):
    import posttrain.evaluate as ev
    from posttrain.serve.gate import quality_gate

    real = ev.evaluate
    calls = []

    def fake(engine, difficulties, n, **kw):  # standard first, then the int8 fast tier
        table = real(engine, difficulties, n, **kw)
        calls.append(type(engine).__name__)
        if len(calls) == 2:
            bumped = {
                d: ev.DomainResult(d, r.difficulty, r.n, r.accuracy - 0.02, r.mean_score)
                for d, r in table.results.items()
            }
            return ev.EvalTable(table.model_version, bumped)
        return table

    monkeypatch.setattr(ev, "evaluate", fake)
    path = save_model(tmp_path / "m", "micro")
    result = quality_gate(path, "int8", ("reverse",), 3)
    assert calls == ["HFEngine", "SpeculativeEngine"]  # the standard tier is the hf engine (check_finite on)
    assert not result.passed and result.as_dict()["delta"]["reverse"] == -0.02
    calls.clear()
    assert quality_gate(path, "int8", ("reverse",), 3, max_drop=0.05).passed
