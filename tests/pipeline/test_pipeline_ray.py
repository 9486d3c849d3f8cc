"""`runtime: ray`: the same rollouts as in process, and a killed actor's group is retried.

One local Ray cluster for the module (about 5 s to start)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

from posttrain.configs.pipeline import PipelineConfig
from posttrain.domains.registry import get
from posttrain.pipeline import EmbeddedWorkers, Pipeline, Scheduler
from posttrain.types import SamplingParams

pytestmark = pytest.mark.ray

CFG = PipelineConfig(
    generate_workers=1,
    execute_workers=2,
    verify_workers=2,
    execute_cpus=0.25,
    verify_cpus=0.25,
    backoff_s=0.01,
    max_retries=3,
)  # 1 + 2 x 0.25 + 2 x 0.25 CPUs: what the 2-CPU cluster holds


USERFNS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "byo", "userfns")

FITS = ["pipeline.execute_cpus=0.1", "pipeline.verify_cpus=0.1"]
"""Loop runs with the default worker counts: 1 + 4 x 0.1 + 2 x 0.1 CPUs fit the 2-CPU cluster."""


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # the user reward functions of tests/byo (byo_rewards:odd_length) importable by the actors too
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (USERFNS, os.environ.get("PYTHONPATH")) if p)
    sys.path.insert(0, USERFNS)
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
    return [get("add").sample(i, "train", 1) for i in range(3)] + [
        get("reverse").sample(i, "train", 1) for i in range(3)
    ]


def _run(workers, tasks):
    sched = Scheduler(CFG, {"add": 1.0, "reverse": 1.0}, {"add": "short", "reverse": "short"})
    params = SamplingParams(max_tokens=8, temperature=1.0, n=4)

    async def go():
        async with Pipeline(CFG, workers, params, sched, group_prefix="7:", seed=11) as p:
            return await p.run_groups(tasks), p.stats()

    return asyncio.run(go())


def _view(results):
    return [
        [(r.group_id, r.completion.token_ids, r.reward, r.completion.model_version) for r in g.rollouts]
        for g in results
    ]


def test_ray_runtime_matches_in_process(ray_cluster, engine):
    import torch

    from posttrain.pipeline.ray import RayWorkers

    tasks = _tasks()
    workers = RayWorkers.from_engine(engine, CFG)
    views = []
    try:
        for version in (0, 1):
            if version:  # new weights in the driver reach the actors through sync()
                gen = torch.Generator().manual_seed(0)
                with torch.no_grad():
                    for p in engine.model.parameters():
                        p.add_(0.05 * torch.randn(p.shape, generator=gen))
                engine.update_weights(None)
            local, _ = _run(EmbeddedWorkers(engine), tasks)
            workers.sync()
            remote, stats = _run(workers, tasks)
            assert _view(remote) == _view(local)
            assert {r.completion.model_version for g in remote for r in g.rollouts} == {engine.version}
            assert stats.counters["masked_groups"] == 0
            for a, b in zip(local, remote):
                for x, y in zip(a.rollouts, b.rollouts):
                    assert x.completion.logprobs == pytest.approx(y.completion.logprobs, abs=1e-4)
            views.append(_view(remote))
        assert views[0] != views[1]  # the new weights changed the samples, so the push mattered
    finally:
        workers.close()


def test_killed_ray_sandbox_actor_is_retried(ray_cluster, engine, tmp_path):
    from posttrain.pipeline.ray import RayWorkers

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
        encode, generate, end_sessions = local.encode, local.generate, local.end_sessions
        execute, verify = workers.execute, workers.verify
        sync, cheap_verifier, inline = workers.sync, workers.cheap_verifier, workers.inline

    try:
        results, stats = _run(Mixed(), _tasks())
    finally:
        workers.close()
    assert os.path.exists(marker)
    assert stats.counters["retries"] >= 1 and stats.counters["masked_groups"] == 0
    assert all(r.reward is not None and r.exec_result == "ran" for g in results for r in g.rollouts)


def test_train_with_ray_runtime_matches_embedded(ray_cluster, micro_base, tmp_path):
    from posttrain.configs import load_config
    from posttrain.loop import train
    from posttrain.trace import TraceStore

    rows = [{"q": f"{a}+{b}=", "a": str(a + b)} for a in range(10, 40) for b in range(3)]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = [
        "rollout.prompts_per_step=4",
        "rollout.group_size=4",
        "rollout.max_tokens=6",
        "eval.tasks_per_domain=4",
        "eval.max_tokens=6",
        "run.threads=1",
        "run.progress=false",
        "monitor.report=false",
        "run.steps=2",
        "trainer.lr=0.01",
        *FITS,
        # odd-length answers pay: the micro model's groups are mixed from step 1, so the trainer steps
        "tasks.domains={odd: {source: {path: %s, fields: {prompt: q, answer: a}}, "
        "verifier: {name: python, path: 'byo_rewards:odd_length'}}}" % (tmp_path / "q.jsonl"),
        f"model.path={micro_base}",
        f"run.out_dir={tmp_path}",
    ]
    runs, results = {}, {}
    for runtime in ("embedded", "ray"):
        result = train(load_config(None, [*base, f"runtime={runtime}", f"run.name={runtime}"]), log=lambda *_: None)
        rows = TraceStore(result.run_dir / "trace.db").recent(1000)
        runs[runtime], results[runtime] = (
            sorted((r["group_id"], r["task_id"], r["completion"], r["reward"], r["model_version"]) for r in rows),
            result,
        )
    assert len(runs["ray"]) == 2 * 4 * 4
    assert runs["ray"] == runs["embedded"]  # step 2 samples from weights pushed to the actor after step 1
    # ... and those weights differ from the base's: step 1 applied a non-zero update, step 2's rows
    # come from the pushed version, and the weights the run ended with are not the base's
    run_dir = results["ray"].run_dir
    train_rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    step1 = next(r for r in train_rows if r["kind"] == "train" and r["step"] == 1)
    assert step1["outcome"] == "applied" and step1["grad_norm"] > 0
    assert {r[4] for r in runs["ray"] if r[0].startswith("2:")} == {1}
    assert _max_weight_change(micro_base, run_dir) > 0


def _max_weight_change(base_dir, run_dir):
    """Largest |final - base| over the parameters of the run's newest checkpoint."""
    from pathlib import Path

    from safetensors.torch import load_file

    base = load_file(str(Path(base_dir) / "model.safetensors"))
    final = load_file(str(max((Path(run_dir) / "checkpoints").glob("step_*")) / "model.safetensors"))
    return max(float((final[k] - base[k]).abs().max()) for k in base if k in final)


def test_file_domain_is_scored_by_ray_actors(ray_cluster, micro_base, tmp_path):
    # the cluster started before the file domain existed: the actors learn it from their runtime_env
    import json

    from posttrain.configs import load_config
    from posttrain.loop import train
    from posttrain.trace import TraceStore

    rows = [{"q": f"{a}-{b}=", "a": str(a - b)} for a in range(10, 60) for b in range(3)]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(
        None,
        [
            "rollout.prompts_per_step=4",
            "rollout.group_size=2",
            "rollout.max_tokens=6",
            "eval.tasks_per_domain=2",
            "eval.max_tokens=6",
            "eval.samples=0",
            "run.threads=1",
            "run.progress=false",
            "monitor.report=false",
            "run.steps=1",
            *FITS,
            "runtime=ray",
            f"model.path={micro_base}",
            f"run.out_dir={tmp_path}",
            "run.name=ray-file",
            "tasks.domains={add: {difficulty: 1}, mine: {source: {path: %s, fields: {prompt: q, answer: a}}, "
            "verifier: numeric}}" % (tmp_path / "q.jsonl"),
        ],
    )
    result = train(cfg, log=lambda *_: None)
    mine = [r for r in TraceStore(result.run_dir / "trace.db").recent(100) if r["domain"] == "mine"]
    assert mine and all(r["reward"] is not None and r["error_kind"] is None for r in mine)


def test_multi_turn_episodes_on_ray_match_in_process(ray_cluster, engine):
    """The same envs.driver steps the episodes on both runtimes (environments in the
    pipeline's process, verification on the actors): identical transcripts and rewards."""
    from posttrain.domains.base import Budget
    from posttrain.pipeline.ray import RayWorkers

    name = "tool_transfer"
    tasks = [get(name).sample(i, "train", 1) for i in range(2)]
    sched_args = ({name: 1.0}, {name: "short"})
    budgets = {name: Budget(turns=3, tokens=6)}
    params = SamplingParams(max_tokens=6, n=2, stop=tuple("aeiou 0123456789{"))  # short turns that end on a stop

    def run(workers):
        async def go():
            async with Pipeline(
                CFG, workers, params, Scheduler(CFG, *sched_args), group_prefix="3:", seed=5, budgets=budgets
            ) as p:
                return await p.run_groups(tasks)

        return [
            [
                (r.completion.token_ids, r.loss_mask, r.reward, [(t.action, t.observation) for t in r.turns])
                for r in g.rollouts
            ]
            for g in asyncio.run(go())
        ]

    workers = RayWorkers.from_engine(engine, CFG)
    try:
        workers.sync()
        remote = run(workers)
    finally:
        workers.close()
    local = run(EmbeddedWorkers(engine))
    assert remote == local
    assert all(turns and rew is not None for g in remote for _, _, rew, turns in g)
    assert any(len(turns) > 1 for g in remote for _, _, _, turns in g)  # observations went back in
