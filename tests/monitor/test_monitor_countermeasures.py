"""The collapse alarms' countermeasure actions: raised within their bounds, recorded like every
action, applied by the loop, replayed on resume; and in a real run on the micro base, the planted
collapse fires the alarm, the entropy bonus engages and its loss term is nonzero afterwards."""

from __future__ import annotations

import pytest
from monitor_testlib import TINY, Coin, plant_collapse

from posttrain.configs import load_config
from posttrain.domains import registry
from posttrain.loop import apply_actions
from posttrain.metrics_log import MetricsLog, read_metrics
from posttrain.monitor.actions import RaiseDiversityReward, RaiseEntropyBonus
from posttrain.monitor.alarms import STEP_DETECTORS
from posttrain.monitor.monitor import Monitor, RunContext
from posttrain.monitor.signals import DomainSignals
from posttrain.pipeline.countermeasures import Countermeasures
from posttrain.tasks.pool import TaskPool
from posttrain.trace import TraceStore

_SIG = dict.fromkeys(
    (
        "reward_mean reward_std pass_rate entropy distinct_answers distinct_n edit_distance length_mean "
        "truncated_share adv_mean adv_std ratio_mean clip_share filtered_share infra_error_rate"
    ).split(),
    0.5,
)


def _sig(entropy: float) -> DomainSignals:
    return DomainSignals(rollouts=8, scored=8, groups=1, **{**_SIG, "entropy": entropy, "reward_mean": 0.2})


def _fall_and_recover(mon: Monitor, domain: str, start: int) -> int:
    """Entropy 2.0 for 3 steps then 0.1 for 3 (fires), then 2.0 for 3 (clears): the next step."""
    h = mon.history.signals.setdefault(domain, [])
    for i, e in enumerate([2.0] * 3 + [0.1] * 3):
        h.append((start + i, _sig(e)))
    return start + 6


def test_countermeasure_raises_by_step_within_bound_and_survives_resume(tmp_path):
    cfg = load_config(
        None,
        [
            "tasks.domains={add: {difficulty: 1}, reverse: {difficulty: 1}}",
            "monitor.alarms.baseline_steps=3",
            "monitor.alarms.window=3",
            "monitor.alarms.entropy_collapse.action=countermeasures",
            "monitor.countermeasures.entropy_step=0.02",
            "monitor.countermeasures.entropy_max=0.03",
            "monitor.countermeasures.diversity_step=0.1",
            "monitor.probes.enabled=false",
        ],
    )
    pool = TaskPool(cfg.tasks, seed=0)
    trace, metrics = TraceStore(tmp_path / "trace.db"), MetricsLog(tmp_path / "metrics.jsonl")
    mon = Monitor(cfg.monitor, RunContext.of(cfg, tmp_path), trace, metrics, pool, log=lambda *_: None)
    cm = Countermeasures(cfg.trainer.entropy_bonus, cfg.rollout.diversity_reward)
    assert mon.start() == []
    fired = []
    for _ in range(3):  # the alarm fires, its condition clears, it fires again: three episodes
        mon.history.signals["add"] = []
        step = _fall_and_recover(mon, "add", 1)
        mon._check(step - 1, STEP_DETECTORS)
        fired.append(mon._take())
        apply_actions(fired[-1], pool, "", cm)
        mon.history.signals["add"] = [(i, _sig(2.0)) for i in range(1, 7)]
        mon._check(step, STEP_DETECTORS)  # cleared: re-armed
    assert fired[0] == [RaiseEntropyBonus("add", 0.02), RaiseDiversityReward("add", 0.1)]
    assert fired[1] == [RaiseEntropyBonus("add", 0.03), RaiseDiversityReward("add", 0.2)]  # capped at 0.03
    assert fired[2] == [RaiseDiversityReward("add", 0.3)]  # entropy already at its bound
    assert cm.entropy_coef("add") == 0.03 and cm.entropy_coef("reverse") == 0.0
    alarms = read_metrics(tmp_path / "metrics.jsonl", "alarm")
    assert [a["action"] for a in alarms] == ["countermeasures"] * 3
    assert alarms[0]["done"] == "entropy bonus of add raised to 0.02; diversity reward of add raised to 0.1"
    assert alarms[2]["done"].startswith("entropy bonus of add already at its bound 0.03")
    assert [e["domain"] for e in trace.events("alarm")] == ["add"] * 3
    # a resumed run's monitor hands the raised values back to a fresh run's countermeasures
    again = Monitor(cfg.monitor, RunContext.of(cfg, tmp_path), trace, metrics, TaskPool(cfg.tasks, seed=0))
    fresh = Countermeasures(cfg.trainer.entropy_bonus, cfg.rollout.diversity_reward)
    apply_actions(again.start(0, mon.state_dict()), pool, "", fresh)
    assert (fresh.entropy_coef("add"), fresh.diversity_weight("add")) == (0.03, cm.diversity_weight("add"))


def test_bad_countermeasure_config_is_refused():
    from posttrain.errors import ConfigError

    with pytest.raises(ConfigError, match="entropy_max"):
        load_config(None, ["monitor.countermeasures.entropy_max=2"])
    with pytest.raises(ConfigError, match="action"):
        load_config(None, ["monitor.alarms.kl_acceleration.action=raise_entropy"])  # collapse alarms only
    with pytest.raises(ConfigError, match="entropy_bonus"):
        load_config(None, ["trainer.entropy_bonus.domains={add: 3}"])
    with pytest.raises(ConfigError, match="diversity_reward"):
        load_config(None, ["rollout.diversity_reward.weight=1.5"])
    with pytest.raises(ConfigError, match="novelty"):
        load_config(None, ["rollout.diversity_reward.novelty=edit"])


PLANT = 4  # TINY: a 3-step baseline, then 3-step windows; the alarm fires by step PLANT + 2 at the latest


@pytest.mark.heavy
def test_planted_collapse_engages_the_entropy_bonus(tmp_path, micro_base, monkeypatch):
    from posttrain.loop import train

    monkeypatch.setitem(registry._REGISTRY, "test_coin", Coin())
    plant_collapse(monkeypatch, PLANT)
    extra = [
        "run.steps=9",
        "monitor.probes.enabled=false",
        "tasks.domains={test_coin: {difficulty: 1}}",
        "monitor.alarms.entropy_collapse.action=countermeasures",
    ]
    cfg = load_config(None, [*TINY, f"model.path={micro_base}", f"run.out_dir={tmp_path}", "run.name=cm", *extra])
    run_dir = train(cfg, log=lambda *_: None).run_dir
    (hit,) = [a for a in read_metrics(run_dir / "metrics.jsonl", "alarm") if a["alarm"] == "entropy_collapse"]
    assert PLANT < hit["step"] <= PLANT + 2 and hit["action"] == "countermeasures"
    assert hit["done"] == "entropy bonus of test_coin raised to 0.01; diversity reward of test_coin raised to 0.1"
    train_rows = read_metrics(run_dir / "metrics.jsonl", "train")
    before = [r for r in train_rows if r["step"] <= hit["step"]]
    after = [r for r in train_rows if r["step"] > hit["step"]]
    assert after and all(r["entropy_bonus"] == 0.0 and r["entropy_bonus_coef"] == {} for r in before)
    # from the next step on, the bonus is in the loss with a nonzero term on every step, and the
    # collapsed groups (no reward variance) are kept for it instead of being filtered
    assert all(r["entropy_bonus_coef"] == {"test_coin": 0.01} and r["entropy_bonus"] > 0.0 for r in after)
    assert all(r["groups_kept"] == r["groups"] for r in after)
    # the diversity reward is on too: the trace keeps the verifier's reward and the bonus apart
    rows = TraceStore(run_dir / "trace.db").recent(10_000)
    late = [r for r in rows if int(r["group_id"].split(":")[0]) > hit["step"]]
    assert late and all("diversity_bonus" in r["parts"] and r["reward"] in (0.0, 1.0) for r in late)
    assert all("diversity_bonus" not in r["parts"] for r in rows if r not in late)


@pytest.mark.heavy
def test_raised_countermeasures_survive_resume_exactly(tmp_path, micro_base, monkeypatch):
    """Resume == uninterrupted with the countermeasures raised before the checkpoint (compared in
    one process on one machine: a property of exact resume, not of a trajectory)."""
    from posttrain.loop import train

    monkeypatch.setitem(registry._REGISTRY, "test_coin", Coin())
    plant_collapse(monkeypatch, PLANT)  # fires by step PLANT + 2 = 6, before the step-7 checkpoint
    extra = [
        "monitor.probes.enabled=false",
        "tasks.domains={test_coin: {difficulty: 1}}",
        "monitor.alarms.entropy_collapse.action=countermeasures",
    ]

    def run(name, steps):
        where = [f"model.path={micro_base}", f"run.out_dir={tmp_path}", f"run.name={name}", f"run.steps={steps}"]
        return train(load_config(None, [*TINY, *where, *extra]), log=lambda *_: None).run_dir

    full, part = run("full", 8), run("part", 7)
    cfg_path = part / "config.yaml"
    cfg_path.write_text(cfg_path.read_text().replace("steps: 7", "steps: 8"))
    resumed = train(None, resume=part, log=lambda *_: None).run_dir

    def rows(d):
        trace = TraceStore(d / "trace.db").recent(10_000)
        return sorted((r["task_id"], r["completion"], r["reward"], r["parts"].get("diversity_bonus")) for r in trace)

    def last(d):
        return read_metrics(d / "metrics.jsonl", "train")[-1]

    assert last(full)["entropy_bonus_coef"] == {"test_coin": 0.01}  # raised before the checkpoint
    assert last(resumed)["entropy_bonus_coef"] == last(full)["entropy_bonus_coef"]
    assert last(resumed)["entropy_bonus"] == last(full)["entropy_bonus"]
    assert rows(resumed) == rows(full)
