"""Scheduler and continuous mode: the realised mix, tiers and slots, the adaptive cap,
the staleness bound, dynamic sampling with replacement."""
from __future__ import annotations

import asyncio
import itertools
import threading
import time

import pytest
from pipeline_testlib import ScriptedEngine

from posttrain.domains.registry import get
from posttrain.errors import ConfigError
from posttrain.pipeline import AdaptiveCap, EmbeddedWorkers, Pipeline, PipelineConfig, Scheduler
from posttrain.types import SamplingParams

WEIGHTS = {"add": 3.0, "sub": 1.0, "reverse": 2.0, "sort": 2.0}
TIERS = {"add": "short", "sub": "short", "reverse": "short", "sort": "long"}


def _source():
    counters = {n: itertools.count() for n in WEIGHTS}
    return lambda name: get(name).sample(next(counters[name]), "train", 1)


class SkewedExec:
    """Simulated execution: long-tier tasks take 20x longer; tracks long tasks in flight."""

    def __init__(self, short_s=0.0005, factor=20):
        self.short_s, self.factor = short_s, factor
        self.lock = threading.Lock()
        self.long_now = self.long_max = 0

    def __call__(self, task, completion):
        long = TIERS[task.domain] == "long"
        with self.lock:
            self.long_now += long
            self.long_max = max(self.long_max, self.long_now)
        time.sleep(self.short_s * (self.factor if long else 1))
        with self.lock:
            self.long_now -= long


def _continuous(cfg, engine, execute, batches, per_batch, informative_fn=lambda g: True, bump=False):
    sched = Scheduler(cfg, WEIGHTS, TIERS)

    async def go():
        got = []
        async with Pipeline(
            cfg, EmbeddedWorkers(engine, execute), SamplingParams(n=2), sched, source=_source(), seed=5
        ) as p:
            for _ in range(batches):
                got += await p.collect(per_batch, engine.version, informative_fn)
                if bump:
                    engine.update_weights()
            p.pause_feeding()
            return got, p.stats()

    return asyncio.run(go()), sched


def test_realised_mix_within_5pct_over_1000_rollouts_under_20x_skew():
    cfg = PipelineConfig(execute_workers=8, max_inflight=24, min_inflight=8, long_slots=4, queue_size=32)
    ex = SkewedExec()
    (groups, stats), sched = _continuous(cfg, ScriptedEngine(lambda c, j: str(j)), ex, batches=10, per_batch=50)
    rollouts = [r for g in groups for r in g.rollouts]
    assert len(rollouts) == 1000
    total = sum(WEIGHTS.values())
    for name, w in WEIGHTS.items():
        share = sum(r.task.domain == name for r in rollouts) / len(rollouts)
        assert abs(share - w / total) <= 0.05, (name, share)
    # long tasks only ever held their own slots (a group's 2 samples execute concurrently)
    assert ex.long_max <= 2 * cfg.long_slots
    mix = sched.mix()
    assert all(abs(row["realised"] - row["target"]) <= 0.05 for row in mix.values())
    # long tasks were not starved: trained share tracks sampled share
    sampled = stats.counters["long_sampled"] / stats.counters["admitted"]
    trained = stats.counters["long_trained"] / stats.counters["trained"]
    assert abs(sampled - trained) <= 0.05 and trained > 0.2


def test_staleness_bound_drops_old_groups_and_counts_them():
    cfg = PipelineConfig(
        max_staleness=1, execute_workers=4, max_inflight=32, min_inflight=32, long_slots=4, queue_size=64
    )
    engine = ScriptedEngine(lambda c, j: str(j), delay_s=0.002)
    (groups, stats), _ = _continuous(cfg, engine, SkewedExec(), batches=6, per_batch=8, bump=True)
    assert len(groups) == 48
    # every accepted group was at most one version behind the weights it trained
    for b in range(6):
        assert all(b - g.model_version <= 1 for g in groups[b * 8:(b + 1) * 8])
    assert stats.counters["dropped_stale"] > 0
    assert stats.counters["trained"] == 48


def test_dynamic_sampling_filters_and_replaces():
    cfg = PipelineConfig(execute_workers=2, max_inflight=16, min_inflight=4, long_slots=2)
    # sample 0 answers the reference for even task indices only: half the groups are all-wrong
    def policy(context, j):
        return "x"

    (groups, stats), _ = _continuous(cfg, ScriptedEngine(policy), None, batches=1, per_batch=6,
                                     informative_fn=lambda g: g[0].task.id.endswith(("0", "2", "4", "6", "8")))
    assert len(groups) == 6 and stats.counters["filtered"] > 0
    assert stats.counters["trained"] == 6 and stats.counters["admitted"] >= 6 + stats.counters["filtered"]


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
