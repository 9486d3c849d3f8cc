"""`posttrain train` with `runtime: ray` and `pipeline.elastic` on (issue 29, item 1): the run
reaches the elastic pools through its config alone, every step's metrics row carries each
stage's actor count within its bounds and the changes so far, the report shows the pools, and
the trace accounts for every draw exactly once. (Whether a pool grows toward a long stage and
back, and that the samples equal a fixed pool's, is tests/pipeline/test_elastic_ray.py.)"""

from __future__ import annotations

import pytest
from loopcfg import tiny

from posttrain.configs import load_config
from posttrain.metrics_log import read_metrics

pytestmark = pytest.mark.ray


def test_posttrain_train_runs_on_elastic_pools(tmp_path, micro_base):
    ray = pytest.importorskip("ray")
    from posttrain.loop import train
    from posttrain.trace import TraceStore

    elastic = [
        "runtime=ray",
        "pipeline.generate_cpus=0",
        "pipeline.execute_cpus=0.25",
        "pipeline.verify_cpus=0.25",
        "pipeline.execute_workers=1",
        "pipeline.verify_workers=1",
        "pipeline.elastic.enabled=true",
        "pipeline.elastic.execute={min: 1, max: 2}",
        "pipeline.elastic.verify={min: 1, max: 2}",
        "pipeline.elastic.period_s=0.05",
        "pipeline.elastic.hold_periods=1",
        "pipeline.elastic.cooldown_s=0",
    ]
    over = [*tiny(), "run.steps=3", "eval.tasks_per_domain=2", *elastic]
    cfg = load_config(None, [*over, f"model.path={micro_base}", f"run.out_dir={tmp_path}", "run.name=elastic"])
    assert cfg.pipeline.elastic.enabled and cfg.runtime == "ray"
    try:
        result = train(cfg, log=lambda *_: None)
    finally:
        if ray.is_initialized():
            ray.shutdown()
    rows = read_metrics(result.run_dir / "metrics.jsonl", "train")
    assert len(rows) == 3
    for r in rows:
        assert 1 <= r["pool_execute_workers"] <= 2 and 1 <= r["pool_verify_workers"] <= 2, r
        assert r["pool_generate_workers"] == 1
        assert r["pool_changes"] == r["pool_grown"] + r["pool_shrunk"]
    changes = [r["pool_changes"] for r in rows]
    assert changes == sorted(changes)  # cumulative
    assert "Stage pools" in (result.run_dir / "report.html").read_text()
    store = TraceStore(result.run_dir / "trace.db")
    got = store.accounting()
    assert got.exact and not got.lost and not got.trained_twice, got.describe()
    assert got.drawn == 3 * 4  # 3 steps of 4 prompts, each trained or dropped with its reason
    store.close()
