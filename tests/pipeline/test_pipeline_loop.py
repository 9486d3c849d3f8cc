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
