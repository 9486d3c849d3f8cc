"""A start that fails leaves no orphan run directory, and a hub id as model.path says what loads."""

from __future__ import annotations

import pytest

from posttrain.cli import main
from posttrain.configs import load_config
from posttrain.errors import ModelLoadError
from posttrain.loop import train


def test_a_failed_start_leaves_no_run_directory(tmp_path):
    cfg = load_config(None, [f"run.out_dir={tmp_path}", "run.name=r", f"model.path={tmp_path / 'nowhere'}"])
    with pytest.raises(ModelLoadError, match="does not exist"):
        train(cfg, log=lambda _: None)
    assert list(tmp_path.iterdir()) == []


def test_a_hub_id_is_told_what_loads(tmp_path, capsys):
    args = ["train", f"run.out_dir={tmp_path}", "model.path=Qwen/Qwen2.5-0.5B-Instruct"]
    assert main(args) != 0
    err = capsys.readouterr().err
    assert "looks like a hub id" in err and "posttrain models list" in err and "local Hugging Face model folder" in err
    assert list(tmp_path.iterdir()) == []
