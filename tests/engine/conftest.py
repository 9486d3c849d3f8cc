"""Fixtures of the engine tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

VLLM_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "vllm.yaml"
LANE_BASE_STEPS = 800
"""The vllm lane's base: configs/vllm.yaml's, pretrained 800 steps instead of 2,500 (those take
~6 min of a fresh 2-core CI machine, these ~2)."""


@pytest.fixture(scope="session")
def vllm_lane_base(tmp_path_factory) -> Path:
    """configs/vllm.yaml's base at LANE_BASE_STEPS steps (built into the model cache, or reused
    from it), copied out so that nothing done to the shared cache during a run reaches it."""
    from posttrain.configs import load_config
    from posttrain.model.pretrain import ensure_base

    out = tmp_path_factory.mktemp("base") / "base"
    built = ensure_base(load_config(VLLM_CONFIG, [f"base.steps={LANE_BASE_STEPS}"]).base, progress=False)
    shutil.copytree(built, out)
    return out
