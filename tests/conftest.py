"""Shared fixtures: a micro embedded base model and a tiny vision-language model, each built once
per session."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest


def _base(tmp_path_factory, preset: str, steps: int) -> str:
    from posttrain.configs.base import BaseConfig
    from posttrain.model.pretrain import build_base

    out = tmp_path_factory.mktemp("base") / preset
    build_base(BaseConfig(preset=preset, steps=steps, batch_size=16, threads=1), out, progress=False)
    return str(out)


@pytest.fixture(scope="session")
def micro_base(tmp_path_factory) -> str:
    """A micro (22k-parameter) base model, pretrained for a few steps."""
    return _base(tmp_path_factory, "micro", 30)


@pytest.fixture(scope="session")
def tiny_base(tmp_path_factory) -> str:
    """The embedded base's architecture (preset tiny, tied embeddings), pretrained for a few
    steps: what the vllm lane serves."""
    return _base(tmp_path_factory, "tiny", 60)


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory):
    """A tiny embedded vision-language model's folder (model/vision.py: 2 steps on 3 train
    tasks), shared by the engine, trainer and serve tests; each loads its own copy."""
    from posttrain.model import vision

    spec = vision.VisionSpec(steps=2, batch_size=2, pool=1)
    return vision.build_vlm(spec, tmp_path_factory.mktemp("vlm") / "m", progress=False)


@pytest.fixture
def raising_domain(monkeypatch):
    """Register, for one test, a procedural domain whose verifier always raises
    (an infra failure: its rollouts must be masked and counted, never scored 0)."""

    from posttrain.domains import registry
    from posttrain.domains.base import ProceduralDomain

    class Boom:
        name, version = "boom", "1"

        def score(self, task, episode):
            raise RuntimeError("verifier crashed")

    def make(name: str) -> ProceduralDomain:
        cls = type(
            name,
            (ProceduralDomain,),
            {
                "name": name,
                "category": "test",
                "generate": lambda self, rng, difficulty: (f"{rng.randint(0, 9)}+0=", "0"),
            },
        )
        dom = cls()
        dom.verifier = Boom()
        monkeypatch.setitem(registry._REGISTRY, name, dom)
        return dom

    return make
