"""Shared fixtures: a micro embedded base model built once per session."""
from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest


@pytest.fixture(scope="session")
def micro_base(tmp_path_factory) -> str:
    """A micro (22k-parameter) base model, pretrained for a few steps."""
    from posttrain.model.pretrain import BaseConfig, build_base

    out = tmp_path_factory.mktemp("base") / "micro"
    build_base(BaseConfig(preset="micro", steps=30, batch_size=16, threads=1), out, progress=False)
    return str(out)
