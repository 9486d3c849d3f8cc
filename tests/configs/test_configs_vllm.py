"""configs/vllm.yaml is the demo (configs/default.yaml) with its rollouts sampled by vLLM: the
same base, tasks, rollouts, trainer and evaluation; only the engine, the step count and the
pipeline's mode (async, max_staleness 1: continuous rollouts) differ."""

from __future__ import annotations

from pathlib import Path

from posttrain.configs import load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_the_vllm_config_is_the_demo_on_the_vllm_engine():
    demo, vllm = load_config(CONFIGS / "default.yaml"), load_config(CONFIGS / "vllm.yaml")
    assert vllm.engine.kind == "vllm" and vllm.engine.url is None  # posttrain starts the server
    assert demo.engine.kind == "hf"
    for section in ("base", "tasks", "rollout", "trainer", "eval"):
        assert getattr(vllm, section) == getattr(demo, section), section
    assert demo.pipeline.mode == "sync" and (vllm.pipeline.mode, vllm.pipeline.max_staleness) == ("async", 1)
    assert vllm.pipeline.model_copy(update={"mode": "sync", "max_staleness": 0}) == demo.pipeline
    assert vllm.rollout.top_p == 1.0  # the vllm engine refuses top_p < 1
    assert 30 <= vllm.run.steps < demo.run.steps
