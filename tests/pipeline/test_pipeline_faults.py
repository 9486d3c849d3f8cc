"""Infra faults in each stage: retried or masked and counted, never scored 0; the pipeline goes on."""

from __future__ import annotations

import asyncio
import threading

from pipeline_testlib import ScriptedEngine

from posttrain.configs.pipeline import PipelineConfig
from posttrain.domains.registry import get
from posttrain.errors import SandboxError
from posttrain.pipeline import EmbeddedWorkers, Pipeline, Scheduler
from posttrain.types import SamplingParams

FAST = dict(backoff_s=0.001, execute_workers=2, verify_workers=2)


def _tasks(n=6):
    return [get("add").sample(i, "train", 1) for i in range(n // 2)] + [
        get("reverse").sample(i, "train", 1) for i in range(n - n // 2)
    ]


def answer_policy(context: str, j: int) -> str:
    return "0" if j % 2 else "1"


def _run(tasks, engine, cfg, execute=None, events=None, domains=("add", "reverse")):
    sched = Scheduler(cfg, {d: 1.0 for d in domains}, {d: "short" for d in domains}, events)

    async def go():
        async with Pipeline(
            cfg, EmbeddedWorkers(engine, execute), SamplingParams(n=4), sched, events=events, seed=3
        ) as p:
            return await p.run_groups(tasks), p.stats(), sched

    return asyncio.run(go())


def test_results_in_task_order_one_rollout_per_sample():
    tasks = _tasks(8)
    results, stats, _ = _run(tasks, ScriptedEngine(answer_policy), PipelineConfig(**FAST))
    assert [g.rollouts[0].task.id for g in results] == [t.id for t in tasks]
    assert all(len(g.rollouts) == 4 and all(r.reward is not None for r in g.rollouts) for g in results)
    assert len({r.group_id for g in results for r in g.rollouts}) == 8
    for q in stats.queues:
        assert q.puts == q.gets and q.depth == 0
    by = {s.name: s for s in stats.stages}
    assert by["generate"].items == by["execute"].items == by["verify"].items == 8
    assert all(abs(s.busy_s + s.idle_s - s.workers * s.elapsed_s) < 1e-6 for s in stats.stages)


def test_engine_failure_is_retried_then_scored():
    results, stats, _ = _run(_tasks(1), ScriptedEngine(answer_policy, fail_first=1), PipelineConfig(**FAST))
    assert stats.counters["retries"] == 1 and stats.counters["masked_groups"] == 0  # one group: no split, a retry
    assert all(r.reward is not None for g in results for r in g.rollouts)


def test_engine_that_keeps_failing_is_masked_never_zero():
    results, stats, _ = _run(
        _tasks(), ScriptedEngine(answer_policy, fail_first=10**6), PipelineConfig(max_retries=1, **FAST)
    )
    rollouts = [r for g in results for r in g.rollouts]
    assert len(rollouts) == 24 and stats.counters["masked_rollouts"] == 24
    assert all(
        r.reward is None and r.error_kind == "generation" and "scripted engine failure" in r.error for r in rollouts
    )


def test_engine_timeout_is_retried():
    engine = ScriptedEngine(answer_policy, hang_first=1, hang_s=0.4)
    cfg = PipelineConfig(generate_timeout_s=0.1, generate_batch=64, max_retries=5, **FAST)
    results, stats, _ = _run(_tasks(), engine, cfg)
    # the abandoned call still holds the engine for a while, so a retry may time out too
    assert stats.counters["retries"] >= 6 and stats.counters["masked_groups"] == 0
    assert stats.stages[0].errors >= 1
    assert all(r.reward is not None for g in results for r in g.rollouts)


def test_killed_sandbox_worker_is_retried():
    from posttrain.sandbox import ExecResult, raise_for_infra

    seen: set[str] = set()
    lock = threading.Lock()

    def execute(task, completion):
        with lock:
            first = task.id not in seen
            seen.add(task.id)
        res = ExecResult.infra("worker killed mid-task", "forkserver") if first else ExecResult(status="ok")
        return raise_for_infra(res)

    results, stats, _ = _run(_tasks(), ScriptedEngine(answer_policy), PipelineConfig(**FAST), execute=execute)
    assert stats.counters["retries"] == 6 and stats.counters["masked_groups"] == 0
    assert all(r.reward is not None and r.exec_result.status == "ok" for g in results for r in g.rollouts)


def test_sandbox_that_stays_down_is_masked_as_sandbox_error():
    def execute(task, completion):
        raise SandboxError("sandbox pool is gone")

    results, stats, _ = _run(
        _tasks(2), ScriptedEngine(answer_policy), PipelineConfig(max_retries=2, **FAST), execute=execute
    )
    assert stats.counters["retries"] == 4
    assert all(r.reward is None and r.error_kind == "sandbox" for g in results for r in g.rollouts)


def test_raising_verifier_masks_pauses_domain_with_alarm(raising_domain):
    dom = raising_domain("test_flaky_verifier")
    events = []
    cfg = PipelineConfig(
        degrade_after=3,
        degrade_cooldown_s=3600,
        execute_workers=1,
        verify_workers=1,
        max_inflight=2,
        min_inflight=1,
        long_slots=0,
    )
    tasks = [dom.sample(i, "train", 1) for i in range(10)] + [get("add").sample(0, "train", 1)]
    results, stats, sched = _run(
        tasks, ScriptedEngine(answer_policy), cfg, events=lambda *e: events.append(e), domains=(dom.name, "add")
    )
    flaky = [g for g in results[:10] if g is not None]
    # at most max_inflight groups were admitted past the third failure before the pause
    assert 3 <= len(flaky) <= 5 and stats.counters["paused_skipped"] == 10 - len(flaky)
    assert all(
        r.reward is None and r.error_kind == "verifier" and "verifier crashed" in r.error
        for g in flaky
        for r in g.rollouts
    )
    alarms = [e for e in events if e[0] == "alarm"]
    assert len(alarms) == 1 and alarms[0][2] == dom.name and "paused" in alarms[0][1]
    assert results[10] is not None and all(r.reward is not None for r in results[10].rollouts)  # other domains go on
    assert sched.mix()[dom.name]["paused"] == 1.0


def test_process_pool_verification_matches_threads():
    tasks = _tasks(4)
    threads, _, _ = _run(tasks, ScriptedEngine(answer_policy), PipelineConfig(**FAST))
    sched = Scheduler(PipelineConfig(), {"add": 1.0, "reverse": 1.0}, {"add": "short", "reverse": "short"})
    workers = EmbeddedWorkers(ScriptedEngine(answer_policy), verify_processes=1)

    async def go():
        async with Pipeline(PipelineConfig(**FAST), workers, SamplingParams(n=4), sched, seed=3) as p:
            return await p.run_groups(tasks)

    try:
        procs = asyncio.run(go())
    finally:
        workers.close()
    assert [[r.score for r in g.rollouts] for g in procs] == [[r.score for r in g.rollouts] for g in threads]
