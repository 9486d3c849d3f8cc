"""`posttrain release`: checkpoints into the registry, with the int8 quality gate."""
from __future__ import annotations

import json

import pytest

from posttrain.cli import main
from posttrain.serve.registry import ModelRegistry
from serve_helpers import save_model


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
    assert main(["release", str(run), "--registry", str(tmp_path / "reg"), "--fast-mode", "int8",
                 "--gate-domains", "reverse", "--gate-tasks", "4"]) == 0
    info = ModelRegistry(tmp_path / "reg").version("v1")
    assert set(info.gate["standard"]) == {"reverse"} and "delta" in info.gate
    assert info.fast_mode == ("int8" if info.gate["passed"] else "lossless")


def test_release_errors_name_the_problem(tmp_path, capsys):
    assert main(["release", str(tmp_path), "--registry", str(tmp_path / "reg")]) == 2
    assert "has no checkpoints" in capsys.readouterr().err
    run = _run_dir(tmp_path, steps=(1,))
    assert main(["release", str(run), "--registry", str(tmp_path / "reg"), "--step", "7"]) == 2
    assert "--step 7" in capsys.readouterr().err
