"""Elastic stage pools on a local Ray cluster with a declared custom resource (`sandbox_slot`):
a domain with long executions arrives, the controller grows the execution pool toward it
(as far as the sandbox slots hold), then shrinks it back once executions are quick again; an
execution actor killed mid-call is replaced and its group retried; and the run's samples are
identical in content to a fixed-pool run (same seeds, same rollouts). Generation stays in
process (the engine is the same either way); execution and verification run on the actors."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest

from posttrain.configs.pipeline import PipelineConfig
from posttrain.domains.registry import get
from posttrain.pipeline import EmbeddedWorkers, Pipeline, Scheduler
from posttrain.types import SamplingParams

pytestmark = pytest.mark.ray

SLOTS = 2
"""The cluster's sandbox slots: the execution pool may grow to 4 by its bounds, the slots stop it at 2."""

BASE = dict(
    generate_workers=1,
    generate_cpus=0.0,
    execute_workers=1,
    verify_workers=1,
    execute_cpus=0.25,
    verify_cpus=0.25,
    execute_resources={"sandbox_slot": 1.0},
    backoff_s=0.01,
    max_retries=3,
)
ELASTIC = PipelineConfig(
    **BASE,
    elastic={
        "enabled": True,
        "execute": {"min": 1, "max": 4},
        "verify": {"min": 1, "max": 1},
        "period_s": 0.05,
        "hold_periods": 2,
        "cooldown_s": 0.1,
        "grow_backlog": 0.5,  # 4 calls on 2 actors: 2 wait: a 3rd actor is tried (no slot)
        "shrink_idle": 0.5,
    },
)
FIXED = PipelineConfig(**BASE)


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(
        num_cpus=2,
        resources={"sandbox_slot": SLOTS},
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
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


class Execute:
    """`reverse` executions are long (0.1 s a sample); `add` ones are instant. With a marker
    path, the first long execution kills its actor's process (once: the marker stays)."""

    def __init__(self, marker: str | None = None) -> None:
        self.marker = marker

    def __call__(self, task, completion):
        if task.domain == "reverse":
            if self.marker is not None and not os.path.exists(self.marker):
                open(self.marker, "w").close()
                os._exit(1)
            time.sleep(0.1)
        return f"ran:{len(completion.token_ids)}"


def _mixed(ray_workers, engine):
    local = EmbeddedWorkers(engine)

    class Mixed:
        encode, generate, end_sessions = local.encode, local.generate, local.end_sessions
        execute, verify = ray_workers.execute, ray_workers.verify
        sync, cheap_verifier, inline = ray_workers.sync, ray_workers.cheap_verifier, ray_workers.inline

    return Mixed()


async def _phase(cfg, workers, domain, name, count):
    tasks = [get(domain).sample(i, "train", 1) for i in range(count)]
    sched = Scheduler(cfg, {domain: 1.0}, {domain: "short"})
    params = SamplingParams(max_tokens=8, temperature=1.0, n=4)
    async with Pipeline(cfg, workers, params, sched, seed=5) as p:
        got = await p.run_groups(tasks, prefix=f"{name}:")
        return got, p.stats().counters


def _view(results):
    return [[(r.group_id, r.completion.token_ids, r.reward, r.exec_result) for r in g.rollouts] for g in results]


def _execute_counts(ray_workers):
    return [(c.before, c.after) for c in ray_workers.changes if c.stage == "execute"]


def test_elastic_pool_follows_the_long_domain_and_back_with_the_same_samples(ray_cluster, engine, tmp_path):
    from posttrain.pipeline.ray import RayWorkers

    elastic = RayWorkers(ELASTIC, lambda: None, engine, execute=Execute(str(tmp_path / "killed")))
    phases: list[tuple[str, str, int]] = []
    views, counters, peak = [], [], 1

    async def run_elastic():
        nonlocal peak
        mixed = _mixed(elastic, engine)
        for name, domain, count in [("quick0", "add", 4)] + [(f"long{i}", "reverse", 6) for i in range(6)]:
            got, c = await _phase(ELASTIC, mixed, domain, name, count)
            phases.append((name, domain, count))
            views.append(_view(got))
            counters.append(c)
            peak = max([peak] + [after for _, after in _execute_counts(elastic)])
            if peak == SLOTS and elastic.counts["blocked"]:  # as far as the slots hold: the long domain leaves
                break
        for i in range(40):  # quick executions again, until the pool is back at its min (bounded)
            if len(elastic.pools["execute"].slots) == 1:
                break
            got, c = await _phase(ELASTIC, mixed, "add", f"quick{i + 1}", 4)
            phases.append((f"quick{i + 1}", "add", 4))
            views.append(_view(got))
            counters.append(c)

    try:
        asyncio.run(run_elastic())
        stats = elastic.pool_stats()
    finally:
        elastic.close()

    assert os.path.exists(tmp_path / "killed")  # an execution actor died mid-call...
    assert sum(c["retries"] for c in counters) >= 1  # ...its group was retried
    assert sum(c["masked_groups"] for c in counters) == 0  # nothing lost
    ups = _execute_counts(elastic)
    assert ups[0] == (1, 2) and peak == SLOTS  # toward the long domain...
    assert all(abs(a - b) == 1 for a, b in ups)  # ...one actor at a time
    assert stats["pool_blocked"] >= 1  # bounds allowed 4, the sandbox slots (a custom resource) held 2
    assert ups[-1] == (2, 1) and stats["pool_execute_workers"] == 1  # and back
    assert stats["pool_grown"] >= 1 and stats["pool_shrunk"] >= 1
    assert stats["pool_changes"] == len(elastic.changes)

    fixed = RayWorkers(FIXED, lambda: None, engine, execute=Execute())
    try:

        async def run_fixed():
            mixed = _mixed(fixed, engine)
            return [_view((await _phase(FIXED, mixed, d, n, k))[0]) for n, d, k in phases]

        fixed_views = asyncio.run(run_fixed())
        assert fixed.changes == [] and fixed.pool_stats()["pool_execute_workers"] == 1
    finally:
        fixed.close()
    assert fixed_views == views  # the same samples, rewards and execution results, group by group
    assert any(r[3] == "ran:" + str(len(r[1])) for v in views for g in v for r in g)
