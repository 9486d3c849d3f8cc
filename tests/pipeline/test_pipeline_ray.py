"""`runtime: ray`: the same rollouts as in process, and a killed actor's group is retried.

One local Ray cluster for the module (about 5 s to start)."""
from __future__ import annotations

import asyncio
import os
import sys

import pytest

pytestmark = pytest.mark.ray

from posttrain.domains.registry import get
from posttrain.pipeline import EmbeddedWorkers, Pipeline, PipelineConfig, Scheduler
from posttrain.types import SamplingParams

CFG = PipelineConfig(generate_workers=1, execute_workers=2, verify_workers=2, backoff_s=0.01, max_retries=3)


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def engine(micro_base):
    import torch

    from posttrain.engine.hf import HFEngine
    from posttrain.model.arch import load_model

    torch.set_num_threads(1)
    model, tok = load_model(micro_base, device="cpu")
    return HFEngine(model, tok, device="cpu", seed=0)


def _tasks():
    return [get("add").sample(i, "train", 1) for i in range(3)] + [get("reverse").sample(i, "train", 1) for i in range(3)]


def _run(workers, tasks):
    sched = Scheduler(CFG, {"add": 1.0, "reverse": 1.0}, {"add": "short", "reverse": "short"})
    params = SamplingParams(max_tokens=8, temperature=1.0, n=4)

    async def go():
        async with Pipeline(CFG, workers, params, sched, group_prefix="7:", seed=11) as p:
            return await p.run_groups(tasks), p.stats()

    return asyncio.run(go())


def _view(results):
    return [[(r.group_id, r.completion.token_ids, r.reward, r.completion.model_version) for r in g.rollouts] for g in results]


def test_ray_runtime_matches_in_process(ray_cluster, engine):
    from posttrain.runtime.ray import RayWorkers

    tasks = _tasks()
    local, _ = _run(EmbeddedWorkers(engine), tasks)
    workers = RayWorkers.from_engine(engine, CFG)
    try:
        workers.sync()
        remote, stats = _run(workers, tasks)
    finally:
        workers.close()
    assert _view(remote) == _view(local)
    assert stats.counters["masked_groups"] == 0
    for a, b in zip(local, remote):
        for x, y in zip(a.rollouts, b.rollouts):
            assert x.completion.logprobs == pytest.approx(y.completion.logprobs, abs=1e-4)


def test_killed_ray_sandbox_actor_is_retried(ray_cluster, engine, tmp_path):
    from posttrain.runtime.ray import RayWorkers

    marker = str(tmp_path / "killed")

    def execute(task, completion):
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)  # the sandbox worker process dies mid-task
        return "ran"

    workers = RayWorkers(CFG, lambda: None, engine, execute=execute)
    workers.generators = []  # generation stays in process for this test
    local = EmbeddedWorkers(engine)

    class Mixed:
        encode, generate = local.encode, local.generate
        execute, verify = workers.execute, workers.verify

    try:
        results, stats = _run(Mixed(), _tasks())
    finally:
        workers.close()
    assert os.path.exists(marker)
    assert stats.counters["retries"] >= 1 and stats.counters["masked_groups"] == 0
    assert all(r.reward is not None and r.exec_result == "ran" for g in results for r in g.rollouts)
