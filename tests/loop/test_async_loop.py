"""The loop in pipeline.mode async (pipeline/continuous.py) with weights that really change:
every trained rollout within max_staleness of the trainer's weights, groups that did cross
weight versions, the detached generation copy refreshed, the off-policy correction logged,
and the trace's accounting of the stream's draws exact (trained once, or dropped: stopped)."""

from __future__ import annotations

import threading

import pytest
from loopcfg import tiny

from posttrain.configs import load_config
from posttrain.metrics_log import read_metrics
from posttrain.trace import TraceStore


@pytest.mark.parametrize("k", [1, 2])
def test_async_loop_keeps_the_staleness_bound_while_weights_change(tmp_path, micro_base, parity_domain, monkeypatch, k):
    from posttrain.engine.sync import WeightSync
    from posttrain.loop import train

    pushed: list[list] = []  # the trainer's parameters at each push
    push = WeightSync.push

    def recording_push(self):
        pushed.append([p.detach().clone() for p in self.engine.model.parameters()])
        return push(self)

    monkeypatch.setattr(WeightSync, "push", recording_push)
    cfg = load_config(
        None,
        [
            *tiny("{parity: {difficulty: 1}}"),
            f"model.path={micro_base}",
            f"run.out_dir={tmp_path}",
            f"run.name=async{k}",
            "run.steps=5",
            "rollout.dynamic_sampling=false",
            "trainer.lr=0.01",
            "pipeline.mode=async",
            f"pipeline.max_staleness={k}",
            f"monitor.report={k == 2}",
        ],
    )
    result = train(cfg, log=lambda *_: None)
    assert not any(t.name == "rollout-stream" for t in threading.enumerate())  # the background loop was closed
    rows = read_metrics(result.run_dir / "metrics.jsonl", "train")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    # the weights moved between pushes (an unchanged push would test nothing about staleness)
    assert len(pushed) >= 3
    moved = [max(float((a - b).abs().max()) for a, b in zip(p, q)) for p, q in zip(pushed, pushed[1:])]
    assert all(m > 0.0 for m in moved), moved
    trainer_at = {r["step"]: r["pipe_trainer_version"] for r in rows}  # the weights each step trained from
    assert [trainer_at[s] for s in sorted(trainer_at)] == sorted(trainer_at.values())
    store = TraceStore(result.run_dir / "trace.db")
    trained = [r for r in store.recent(10_000) if r["train_step"] is not None]
    assert len(trained) == sum(r["groups"] for r in rows) * 4 > 0
    lags = [trainer_at[r["train_step"]] - r["model_version"] for r in trained]
    assert all(0 <= lag <= k for lag in lags), lags
    assert max(lags) >= 1  # groups crossed weight versions: trained on weights newer than their own
    assert max(r["model_version"] for r in trained) >= 1  # the generation copy was refreshed between calls
    assert all(r["pipe_staleness_max"] <= k for r in rows) and max(r["pipe_staleness_max"] for r in rows) >= 1
    assert all(r["stale_dropped"] == 0 for r in rows)
    # every task the stream drew: trained once, or dropped with its reason (the run's end: stopped)
    got = store.accounting()
    assert got.exact and not got.lost and not got.trained_twice, got.describe()
    assert got.trained == len({r["group_id"] for r in trained}) > 0
    assert got.dropped.get("stopped", 0) == rows[-1]["pipe_outstanding"] > 0  # admitted, not trained at the end
    if k == 2:  # the report shows the staleness the run trained on, and what was re-queued or dropped (nothing)
        page = (result.run_dir / "report.html").read_text()
        assert f"largest staleness trained on: {max(r['pipe_staleness_max'] for r in rows):.0f}" in page
        assert "no group was re-queued or dropped for staleness" in page
    off = [r for r in rows if r["pipe_staleness_max"] > 0]
    assert all({"ratio_mean", "ratio_max", "clip_frac"} <= set(r) for r in off)  # the correction's size, logged


@pytest.mark.slow
def test_async_loop_against_a_separate_server_process(tmp_path, micro_base, parity_domain, monkeypatch):
    """A remote engine (`posttrain serve` in another process): generation in flight there while
    the trainer pushes new weights over HTTP; every trained rollout's server-reported version is
    within max_staleness of the trainer's at its train step."""
    from posttrain.loop import train
    from serve_process import posttrain_serve

    monkeypatch.setenv("POSTTRAIN_ADMIN_TOKEN", "async-test-admin-token")
    with posttrain_serve(micro_base) as (url, _):
        cfg = load_config(
            None,
            [
                *tiny("{parity: {difficulty: 1}}"),
                f"model.path={micro_base}",
                f"run.out_dir={tmp_path}",
                "run.name=remote",
                "run.steps=4",
                "rollout.dynamic_sampling=false",
                "trainer.lr=0.01",
                "monitor.report=false",
                "engine.type=openai",
                f"engine.url={url}/v1",
                "pipeline.mode=async",
                "pipeline.max_staleness=1",
            ],
        )
        result = train(cfg, log=lambda *_: None)
    rows = read_metrics(result.run_dir / "metrics.jsonl", "train")
    trainer_at = {r["step"]: r["pipe_trainer_version"] for r in rows}
    store = TraceStore(result.run_dir / "trace.db")
    trained = [r for r in store.recent(10_000) if r["train_step"] is not None]
    got = store.accounting()
    assert got.exact and got.trained == len({r["group_id"] for r in trained}) > 0, got.describe()
    lags = [trainer_at[r["train_step"]] - r["model_version"] for r in trained]
    assert trained and all(0 <= lag <= 1 for lag in lags), lags
    assert rows[-1]["engine_version"] >= 3  # weights did travel: one push per applied step
    assert max(lags) >= 1  # groups crossed a weight update on the server
