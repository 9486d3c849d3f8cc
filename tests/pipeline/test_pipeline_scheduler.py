"""Scheduler: the realised mix, tiers and slots, the adaptive cap, degradation."""

from __future__ import annotations

import pytest

from posttrain.configs.pipeline import PipelineConfig
from posttrain.errors import ConfigError
from posttrain.pipeline import AdaptiveCap, Scheduler

WEIGHTS = {"add": 3.0, "sub": 1.0, "reverse": 2.0, "sort": 2.0}
TIERS = {"add": "short", "sub": "short", "reverse": "short", "sort": "long"}


def test_realised_mix_within_5pct_over_1000_admissions_with_long_tasks_holding_slots():
    cfg = PipelineConfig(max_inflight=24, min_inflight=8, long_slots=4)
    s = Scheduler(cfg, WEIGHTS, TIERS)
    inflight: list[str] = []
    for _ in range(1000):
        name = s.pick()
        while name is None:  # admission waits: the oldest group in flight finishes first
            s.finish(inflight.pop(0))
            name = s.pick()
        s.admit(name)
        inflight.append(name)
        assert s.inflight["long"] <= cfg.long_slots
        if len(inflight) > 12:
            s.finish(inflight.pop(0))
    total = sum(WEIGHTS.values())
    assert all(abs(row["realised"] - WEIGHTS[n] / total) <= 0.05 for n, row in s.mix().items())


def test_scheduler_degrades_probes_and_recovers():
    now = [0.0]
    events = []
    cfg = PipelineConfig(degrade_after=2, degrade_cooldown_s=10.0, long_slots=0)
    s = Scheduler(
        cfg, {"a": 1.0, "b": 1.0}, {"a": "short", "b": "short"}, lambda *e: events.append(e), clock=lambda: now[0]
    )
    s.record_verification("a", failed=True)
    assert not s.is_paused("a")
    s.record_verification("a", failed=True)
    assert s.is_paused("a") and [e[0] for e in events] == ["alarm"]
    assert all(s.pick() == "b" for _ in range(3))
    now[0] = 11.0
    assert not s.is_paused("a")
    picked = s.pick()
    s.admit(picked)
    assert picked == "a" and s.is_paused("a")  # one probe in flight, no more
    s.finish("a")
    s.record_verification("a", failed=True)  # the probe failed: paused again, second alarm
    assert s.is_paused("a") and [e[0] for e in events] == ["alarm", "alarm"]
    now[0] = 22.0
    s.admit(s.pick() or "")
    s.record_verification("a", failed=False)
    assert not s.is_paused("a") and events[-1][0] == "recovered"


def test_mix_waits_for_a_lagging_domain_instead_of_drifting():
    cfg = PipelineConfig(long_slots=1, mix_slack=2, max_inflight=8, min_inflight=8)
    s = Scheduler(cfg, {"short": 1.0, "long": 1.0}, {"short": "short", "long": "long"})
    picks = []
    for _ in range(12):
        name = s.pick()
        if name is None:
            break
        s.admit(name)
        picks.append(name)
    # one long slot, never freed: short fills the gap only until long lags by more than mix_slack
    # (long deficit after s shorts: (s + 2) / 2 - 1, which passes mix_slack=2 at s = 5)
    assert picks == ["long"] + ["short"] * 5 and s.pick() is None


def test_adaptive_cap_follows_queue_depth():
    cap = AdaptiveCap(floor=2, ceiling=6)
    assert [cap.update(0.9) for _ in range(6)] == [5, 4, 3, 2, 2, 2]
    assert [cap.update(0.1) for _ in range(5)] == [3, 4, 5, 6, 6]
    assert cap.update(0.5) == 6


def test_bad_scheduler_config_names_the_field():
    with pytest.raises(ConfigError, match="weights must be > 0"):
        Scheduler(PipelineConfig(), {"a": 0.0}, {"a": "short"})
    with pytest.raises(ConfigError, match="no cost class"):
        Scheduler(PipelineConfig(), {"a": 1.0}, {})
    with pytest.raises(ValueError, match="min_inflight"):
        PipelineConfig(min_inflight=10, max_inflight=5)
