"""The closed loop's rollout step through the pipeline: per-step stats in metrics and trace, replacement."""

from __future__ import annotations

import pytest

from posttrain.configs import load_config
from posttrain.metrics_log import read_metrics
from posttrain.trace import TraceStore

TINY = [
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_tokens=6",
    "eval.tasks_per_domain=4",
    "eval.max_tokens=6",
    "run.threads=1",
    "run.progress=false",
    "monitor.report=false",
    "tasks.domains={add: {difficulty: 1}, reverse: {difficulty: 1}}",
]


@pytest.mark.parametrize("direct", [True, False])
def test_loop_records_pipeline_stats_and_replaces_filtered_groups(tmp_path, micro_base, direct):
    from posttrain.loop import train

    cfg = load_config(
        None,
        [
            *TINY,
            f"model.path={micro_base}",
            f"run.out_dir={tmp_path}",
            "run.name=pipe",
            "run.steps=2",
            "pipeline.replace_rounds=1",
            f"pipeline.direct={direct}",
        ],
    )
    result = train(cfg, log=lambda *_: None)
    rows = read_metrics(result.run_dir / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["pipe_direct"] == direct  # add and reverse: single-turn, nothing to run, exact-match verifiers
        assert r["generate_items"] == r["groups"] and r["verify_items"] == r["groups"]
        assert r["groups"] == 4 + r["pipe_replaced"]  # each filtered group of round one got one replacement
        assert {"generate_p50_s", "execute_p99_s", "verify_idle_share", "mix_add"} <= set(r)
        assert ("queue_generate_max_depth" in r) is not direct  # the direct path has no queues
    assert sum(r["pipe_replaced"] for r in rows) > 0  # the micro model mostly fails: many all-zero groups
    store = TraceStore(result.run_dir / "trace.db")
    events = store.events("pipeline")
    assert [e["step"] for e in events] == [1, 2]
    assert store.count() == sum(r["groups"] for r in rows) * 4


def test_loop_off_policy_overlaps_generation_with_staleness_bound(tmp_path, micro_base):
    import threading

    from posttrain.loop import train

    cfg = load_config(
        None,
        [
            *TINY,
            f"model.path={micro_base}",
            f"run.out_dir={tmp_path}",
            "run.name=ahead",
            "run.steps=3",
            "pipeline.max_staleness=1",
            "rollout.dynamic_sampling=false",
        ],
    )
    result = train(cfg, log=lambda *_: None)
    assert not any(t.name == "rollout-pipeline" for t in threading.enumerate())  # the background loop was closed
    rows = read_metrics(result.run_dir / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["pipe_staleness_max"] <= 1 and r["pipe_dropped_stale"] == 0 for r in rows)
    store = TraceStore(result.run_dir / "trace.db")
    traced = store.recent(1000)
    assert len(traced) == 3 * 4 * 4
    # each rollout was trained at the step its group id names, from weights at most one version old
    for r in traced:
        assert r["train_step"] is None or r["group_id"].startswith(f"{r['train_step']}:")


def test_ahead_mode_drops_groups_beyond_the_staleness_bound():
    from pipeline_testlib import ScriptedEngine

    from posttrain.configs.pipeline import PipelineConfig
    from posttrain.configs.tasks import TasksConfig
    from posttrain.pipeline import EmbeddedWorkers, StepRollouts
    from posttrain.tasks.pool import TaskPool
    from posttrain.types import SamplingParams

    class Driver:
        version = 0

    class TwinWorkers(EmbeddedWorkers):
        def sync(self):  # the scripted engine has no weights: syncing copies the version
            self.engine.version = self.source.version

    pool = TaskPool(
        TasksConfig.model_validate({"domains": {"add": {"difficulty": 1}, "reverse": {"difficulty": 1}}}), seed=0
    )
    driver = Driver()
    workers = TwinWorkers(ScriptedEngine(lambda c, j: str(j)), source=driver)
    rollouts = StepRollouts(PipelineConfig(max_staleness=1), workers, pool, seed=0)
    params = SamplingParams(n=2)
    try:
        seen = []
        for step, bumps in ((1, 1), (2, 2), (3, 1), (4, 0)):
            groups, stats = rollouts.sample(pool.draw(4), params, step)
            seen.append(
                (
                    len(groups),
                    stats["pipe_dropped_stale"],
                    stats["pipe_staleness_max"],
                    {g[0].group_id.split(":")[0] for g in groups},
                )
            )
            driver.version += bumps
    finally:
        rollouts.close()
    # step 1 runs its own tasks at once; later steps get groups made one call earlier:
    # at step 3 they were made at version 1 while the trainer is at 3 -> dropped
    assert seen == [(4, 0.0, 0.0, {"1"}), (4, 0.0, 1.0, {"2"}), (0, 4.0, 2.0, set()), (4, 0.0, 1.0, {"4"})]
