"""`runtime: ray` in `posttrain.loop.train`: every actor holds the resources its stage declares
(`pipeline.generate_cpus`, `execute_cpus`, `verify_cpus`), observed from inside the actors while
the run holds them (issue 26, item 5). Ray starts its own local cluster of this machine's size."""

from __future__ import annotations

import os
import sys

import pytest
from loopcfg import tiny

from posttrain.configs import load_config

pytestmark = pytest.mark.ray


def _assigned(self):
    import ray

    return ray.get_runtime_context().get_assigned_resources()


def test_ray_actors_hold_the_resources_their_stage_declares(tmp_path, micro_base, monkeypatch):
    ray = pytest.importorskip("ray")
    from ray import cloudpickle

    from posttrain.loop import train
    from posttrain.pipeline.ray import RayWorkers

    if (os.cpu_count() or 1) < 2:
        pytest.skip("the run declares 2 CPUs")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    seen: dict[str, list[dict[str, float]]] = {}
    total: list[dict[str, float]] = []
    sync = RayWorkers.sync

    def observing_sync(self):
        sync(self)
        total.append(ray.cluster_resources())
        for stage, actors in (("generate", self.generators), ("execute", self.executors), ("verify", self.verifiers)):
            seen[stage] = ray.get([a.__ray_call__.remote(_assigned) for a in actors])

    monkeypatch.setattr(RayWorkers, "sync", observing_sync)
    declared = ["pipeline.generate_cpus=1", "pipeline.execute_cpus=0.25", "pipeline.verify_cpus=0.25"]
    workers = ["pipeline.generate_workers=1", "pipeline.execute_workers=2", "pipeline.verify_workers=2"]
    run = [*tiny(), "run.steps=1", "eval.tasks_per_domain=2", "runtime=ray", *declared, *workers]
    cfg = load_config(None, [*run, f"model.path={micro_base}", f"run.out_dir={tmp_path}", "run.name=ray"])
    try:
        train(cfg, log=lambda *_: None)
    finally:
        if ray.is_initialized():
            ray.shutdown()
    assert seen, "the run never synced its actors: nothing was observed"
    assert seen["generate"] == [{"CPU": 1.0}]
    assert seen["execute"] == [{"CPU": 0.25}] * 2
    assert seen["verify"] == [{"CPU": 0.25}] * 2
    assert total[0]["CPU"] >= 2.0


def test_declarations_the_local_cluster_cannot_hold_are_a_config_error(micro_base):
    pytest.importorskip("ray")
    import ray

    from posttrain.configs.pipeline import PipelineConfig
    from posttrain.errors import ConfigError
    from posttrain.pipeline.ray import RayWorkers

    cfg = PipelineConfig(generate_workers=1, execute_workers=1, verify_workers=1, execute_cpus=1000.0)
    try:
        with pytest.raises(ConfigError, match="execute_cpus"):
            RayWorkers(cfg, factory=lambda: None, encoder=None)
    finally:
        if ray.is_initialized():
            ray.shutdown()
