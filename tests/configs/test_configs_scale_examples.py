"""Every example config under configs/scale validates with the current schema."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.configs import load_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "scale").glob("*.yaml"))


def test_there_are_example_configs():
    assert len(CONFIGS) >= 3


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_example_config_validates(path):
    cfg = load_config(path)
    assert cfg.model.path and cfg.model.path.startswith("/")
    assert cfg.model.device == "cuda"
    assert path.read_text().startswith("#")  # each opens with a comment saying what it runs
