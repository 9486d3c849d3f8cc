"""The direct path (Play.direct, pipeline/play.py) against the staged pipeline: the same groups, samples,
rewards, masks and counters for the same tasks and seeds; and when it is (not) taken."""

from __future__ import annotations

import pytest
from pipeline_testlib import ScriptedEngine

from posttrain.configs.pipeline import PipelineConfig
from posttrain.configs.tasks import TasksConfig
from posttrain.pipeline import EmbeddedWorkers, StepRollouts
from posttrain.pipeline.core import COUNTERS
from posttrain.tasks.pool import TaskPool
from posttrain.types import SamplingParams

FAST = dict(backoff_s=0.001)
KEYS = tuple(f"pipe_{k}" for k in COUNTERS if k not in ("generate_splits", "gathered", "gather_ms")) + (
    "pipe_replaced",
)
"""The counters both paths keep alike (the staged pipeline batches retried groups together
again, so a failing engine may be split more often there; only it waits to gather groups)."""


def _pool(domains=("add", "reverse")) -> TaskPool:
    return TaskPool(TasksConfig.model_validate({"domains": {d: {"difficulty": 1} for d in domains}}), seed=0)


def _steps(engine, direct: bool, steps: int = 3, domains=("add", "reverse"), params=None, **cfg):
    """Per step: every rollout as (task, group id, tokens, reward, error kind), and the counters."""
    pool = _pool(domains)
    rollouts = StepRollouts(PipelineConfig(direct=direct, **FAST, **cfg), EmbeddedWorkers(engine), pool, seed=5)
    assert rollouts.direct is direct
    out = []
    try:
        for step in range(1, steps + 1):
            groups, stats = rollouts.sample(pool.draw(4), params or SamplingParams(n=4, max_tokens=6), step)
            seen = [(r.task.id, r.group_id, r.completion.token_ids, r.reward, r.error_kind) for g in groups for r in g]
            out.append((seen, {k: stats[k] for k in KEYS}))
    finally:
        rollouts.close()
    return out


def test_the_same_samples_and_rewards_as_the_pipeline_with_the_hf_engine(micro_base):
    # real sampling: each group's samples are seeded by (run seed, step, group id, attempt)
    from posttrain.engine.hf import HFEngine

    def engine():
        return HFEngine.from_pretrained(micro_base, seed=0)

    staged = _steps(engine(), False, replace_rounds=1)
    direct = _steps(engine(), True, replace_rounds=1)
    assert direct == staged
    assert _steps(engine(), True, replace_rounds=1, generate_batch=3) == staged  # engine calls of 3 groups
    assert sum(c["pipe_replaced"] for _, c in staged) > 0  # the replacement rounds were exercised
    assert len({tokens for seen, _ in staged for _, _, tokens, _, _ in seen}) > 1


def policy(context: str, j: int) -> str:
    return "1" if j % 2 else "10"


def test_a_failed_generation_is_split_and_retried_the_same_way():
    staged = _steps(ScriptedEngine(policy, fail_first=1), False, steps=2)
    direct = _steps(ScriptedEngine(policy, fail_first=1), True, steps=2)
    assert direct == staged  # the failed call over 4 groups is split in halves, which succeed
    assert staged[0][1]["pipe_retries"] == 0 and staged[0][1]["pipe_masked_groups"] == 0
    staged = _steps(ScriptedEngine(policy, fail_first=3), False, steps=2, generate_batch=2)
    direct = _steps(ScriptedEngine(policy, fail_first=3), True, steps=2, generate_batch=2)
    assert direct == staged  # calls of 2 groups: [0,1] fails, [0] fails and is retried, [1] fails and is retried
    assert staged[0][1]["pipe_retries"] == 2 and staged[0][1]["pipe_masked_groups"] == 0


def test_an_engine_that_keeps_failing_is_masked_and_counted_never_zero():
    staged = _steps(ScriptedEngine(policy, fail_first=10**6), False, steps=1, max_retries=1)
    direct = _steps(ScriptedEngine(policy, fail_first=10**6), True, steps=1, max_retries=1)
    assert direct == staged
    seen, counters = direct[0]
    assert len(seen) == 16 and all(reward is None and kind == "generation" for *_, reward, kind in seen)
    assert counters["pipe_masked_groups"] == 4 and counters["pipe_masked_rollouts"] == 16


def test_a_failing_cheap_verifier_is_masked_and_pauses_its_domain_the_same_way(raising_domain):
    dom = raising_domain("test_boom")
    dom.verifier.cheap = True  # declared cheap: the direct path calls it inline
    kw = dict(domains=("add", "test_boom"), degrade_after=1, degrade_cooldown_s=600.0)
    staged = _steps(ScriptedEngine(policy), False, **kw)
    direct = _steps(ScriptedEngine(policy), True, **kw)
    assert direct == staged
    first = direct[0][0]
    assert any(kind == "verifier" for *_, kind in first)
    assert all(reward is None for task, *_, reward, kind in first if kind == "verifier")
    assert sum(c["pipe_paused_skipped"] for _, c in direct[1:]) > 0  # paused after its first failure


@pytest.mark.parametrize("why", ["code domain", "no cheap verifier", "processes", "execute fn", "off", "timeout"])
def test_the_staged_pipeline_runs_whenever_the_direct_path_could_differ(why, raising_domain):
    domains, cfg, workers_kw = ("add", "reverse"), {}, {}
    if why == "code domain":
        domains = ("add", "code")  # runs what the model wrote: the execute stage
    elif why == "no cheap verifier":
        raising_domain("test_slow")  # a verifier that does not declare itself cheap
        domains = ("add", "test_slow")
    elif why == "processes":
        workers_kw = {"verify_processes": 1}  # verification in processes: not in this process
    elif why == "execute fn":
        workers_kw = {"execute": lambda task, completion: None}
    elif why == "off":
        cfg = {"direct": False}
    elif why == "timeout":
        cfg = {"generate_timeout_s": 5.0}
    workers = EmbeddedWorkers(ScriptedEngine(policy), **workers_kw)
    rollouts = StepRollouts(PipelineConfig(**cfg), workers, _pool(domains), seed=0)
    try:
        assert rollouts.direct is False
    finally:
        rollouts.close()
    ok = StepRollouts(PipelineConfig(), EmbeddedWorkers(ScriptedEngine(policy)), _pool(), seed=0)
    assert ok.direct is True
    ok.close()
