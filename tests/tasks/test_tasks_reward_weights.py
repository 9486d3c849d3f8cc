"""Reward weights per domain (`tasks.domains.<name>.reward_weights`): validated with
a clear error, stamped on every drawn task by the pool, applied by `Domain.score`
in one place, and absent by default (every domain's reward unchanged)."""

from __future__ import annotations

import dataclasses

import pytest

from posttrain.cli import main
from posttrain.configs import load_config
from posttrain.configs.tasks import TasksConfig
from posttrain.domains.base import weigh
from posttrain.domains.registry import get
from posttrain.errors import ConfigError
from posttrain.tasks import TaskPool
from posttrain.types import Episode, Score

WEIGHTS = {"outcome": 1.0, "process": 0.2, "efficiency": 0.1}


def test_weighted_mean_of_the_reported_parts():
    s = Score(0.85, {"outcome": 1.0, "process": 0.5, "efficiency": 0.0}, True, "")
    got = weigh(s, tuple(WEIGHTS.items()))
    # (1.0 * 1.0 + 0.5 * 0.2 + 0.0 * 0.1) / 1.3 = 1.1 / 1.3
    assert got.value == pytest.approx(1.1 / 1.3, abs=1e-12)
    assert got.passed and got.parts == s.parts
    only_outcome = Score(0.4, {"outcome": 0.0}, False, "x")
    assert weigh(only_outcome, tuple(WEIGHTS.items())).value == 0.0  # parts not reported are left out
    assert weigh(only_outcome, ()) is only_outcome  # no weights: the verifier's value
    assert weigh(Score(0.4, {"precision": 1.0}), tuple(WEIGHTS.items())).value == 0.4  # none reported: unchanged


def test_default_config_keeps_every_reward():
    pool = TaskPool(TasksConfig(domains={"tool_transfer": {}, "add": {}}))
    for task in pool.draw(4):
        assert task.meta.reward_weights == ()
        d = get(task.domain)
        assert d.score(task, Episode(d.wrong(task))) == d.verifier.score(task, Episode(d.wrong(task)))


def test_pool_stamps_the_weights_and_score_applies_them():
    cfg = TasksConfig(domains={"tool_transfer": {"reward_weights": WEIGHTS}, "add": {}})
    pool = TaskPool(cfg)
    tasks = {t.domain: t for t in pool.draw(4)}
    tool, add = tasks["tool_transfer"], tasks["add"]
    assert dict(tool.meta.reward_weights) == WEIGHTS and add.meta.reward_weights == ()
    d = get("tool_transfer")
    finish_only = Episode('{"name": "finish", "arguments": {}}')
    raw = d.verifier.score(tool, finish_only)
    weighted = d.score(tool, finish_only)
    assert raw.value == 0.0 and not raw.passed  # the goal is not reached
    p = raw.parts
    expected = (p["outcome"] * 1.0 + p["process"] * 0.2 + p["efficiency"] * 0.1) / 1.3
    assert weighted.value == pytest.approx(expected) and weighted.value > 0.0 and not weighted.passed
    gold = d.score(tool, Episode(d.gold(tool)))
    assert gold.value == 1.0 and gold.passed
    assert pool.taskset_version != TaskPool(TasksConfig(domains={"tool_transfer": {}, "add": {}})).taskset_version


@pytest.mark.parametrize(
    "weights, needle",
    [
        ({"outcome": 1.0, "style": 0.5}, "unknown part(s) 'style'; the parts are outcome, process, efficiency"),
        ({"outcome": -1.0}, "must be finite and >= 0"),
        ({"outcome": 0.0, "process": 0.0}, "at least one weight must be > 0"),
    ],
)
def test_bad_weights_are_refused_with_the_field_named(weights, needle, tmp_path, capsys):
    with pytest.raises(ValueError, match="reward_weights"):
        TasksConfig(domains={"add": {"reward_weights": weights}})
    f = tmp_path / "c.yaml"
    f.write_text("tasks:\n  domains:\n    add:\n      reward_weights: " + repr(weights).replace("'", "") + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(f, [])
    assert "tasks.domains.add.reward_weights" in str(err.value) and needle in str(err.value)
    assert main(["train", str(f), f"run.out_dir={tmp_path}"]) == 2
    assert needle in capsys.readouterr().err


def test_weights_reach_tasks_of_a_pattern():
    pool = TaskPool(TasksConfig(domains={"tool_*": {"reward_weights": {"outcome": 1.0}}}))
    task = pool.draw(1)[0]
    assert task.domain.startswith("tool_") and task.meta.reward_weights == (("outcome", 1.0),)
    assert dataclasses.replace(task.meta, reward_weights=()).taskset_version == task.meta.taskset_version


def test_posttrain_train_applies_the_weights(tmp_path, micro_base, monkeypatch):
    """A config's reward_weights reach the rewards `posttrain train` traces."""
    from posttrain.domains import registry
    from posttrain.domains.base import ProceduralDomain
    from posttrain.loop import train
    from posttrain.trace import TraceStore

    class HalfDone:  # the goal is never reached, the process always right
        name, version = "half_done", "1"

        def score(self, task, episode):
            return Score(0.0, {"outcome": 0.0, "process": 1.0}, False, "goal not reached")

    cls = type(
        "weighted_probe",
        (ProceduralDomain,),
        {
            "name": "weighted_probe",
            "category": "test",
            "generate": lambda self, rng, difficulty: (f"{rng.randint(0, 99)}+0=", "0"),
        },
    )
    dom = cls()
    dom.verifier = HalfDone()
    monkeypatch.setitem(registry._REGISTRY, "weighted_probe", dom)
    cfg = load_config(
        None,
        [
            "rollout.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.max_tokens=4",
            "eval.tasks_per_domain=2",
            "eval.max_tokens=4",
            "run.threads=1",
            "run.progress=false",
            "run.steps=1",
            "run.checkpoint_every=0",
            f"model.path={micro_base}",
            f"run.out_dir={tmp_path}",
            "run.name=w",
            "tasks.domains={weighted_probe: {reward_weights: {outcome: 3.0, process: 1.0}}}",
        ],
    )
    result = train(cfg, log=lambda *_: None)
    rows = TraceStore(result.run_dir / "trace.db").recent(100, "weighted_probe")
    assert rows and all(r["reward"] == pytest.approx(0.25) for r in rows)  # (0 x 3 + 1 x 1) / 4
