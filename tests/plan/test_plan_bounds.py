"""The planner is bounded: every valid cluster file either plans within its simulated-event
budget or gets one ConfigError (one line, exit code 2 from the CLI), never a traceback or a
hang. The property runs over a seeded generator of random valid cluster files and run
profiles that reaches the classes that stalled or crashed (async shapes that can never train a
step, zero costs, rates so small that time overflows, huge worker counts and step sizes)."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import yaml

from posttrain.configs.cluster import ClusterConfig, load_cluster
from posttrain.errors import ConfigError
from posttrain.plan import plan_profile
from posttrain.plan.profile import GroupSample, Profile, RunShape
from posttrain.plan.sim import Costs, Shape, Simulation


def _profile(r: random.Random) -> Profile:
    mode = r.choice(["sync", "async"])
    g = r.choice([1, 2, 4])
    shape = RunShape(
        mode,
        r.choice([0, 1, 2]) if mode == "async" else 0,
        r.choice([1, 2, 8]),
        g,
        r.choice([1, 4, 64]),
        r.choice([1, 8, 64]),
        r.choice([1, 8]),
        (1, 1, 1),
        8,
    )
    groups = []
    for _ in range(r.choice([1, 3, 6])):
        exec_s = r.choice([0.0, 0.0, 1.0, 1e300])
        groups.append(GroupSample(r.choice("ab"), r.choice([0, 1, 50]), 0.1, exec_s, r.choice([0.0, 0.01]), exec_s / g))
    return Profile(
        groups,
        shape,
        r.choice([60.0, float("inf"), 1e-3]),
        r.choice([0.0, 0.002]),
        [r.choice([0, 100])],
        [r.choice([0.0, 1.0])],
    )


def _cluster(r: random.Random) -> dict[str, Any]:
    def pick(*xs: Any) -> Any:
        return r.choice(xs)

    pipeline = {
        "mode": pick(None, "sync", "async"),
        "prompts_per_step": pick(None, 1, 3, 1000, 1_000_000),
        "queue_size": pick(None, 1, 2),
        "max_inflight": pick(None, 1, 2, 1000),
        "generate_batch": pick(None, 1, 65536),
    }
    if pipeline["mode"] == "async":
        pipeline["max_staleness"] = pick(0, 1, 5)
    return {
        "engines": {"count": pick(1, 2, 4096), "tokens_per_s": pick("measured", 1e-300, 1e-3, 1e9, 1e308)},
        "sandbox_slots": pick(1, 64, 1_000_000),
        "trainer": {"tokens_per_s": pick("measured", 1e-300, 1e308), "step_overhead_s": pick("measured", 0, 1e308)},
        "workers": {"generate": pick(1, 1024), "execute": pick(1, 4096), "verify": pick(1, 1024)},
        "search": {"generate": pick([1], [1, 1024]), "execute": pick([1], [1, 4096]), "verify": [1]},
        "pipeline": {k: v for k, v in pipeline.items() if v is not None},
        "simulate": {
            "steps": pick(1, 5, 100_000),
            "replicas": pick(1, 2, 1000),
            "search_steps": pick(1, 5),
            "max_events": pick(1000, 5000),
            "draw": pick("bootstrap", "replay"),
        },
    }


def test_every_valid_cluster_file_plans_within_its_bound_or_gets_one_error(tmp_path):
    outcomes = {"planned": 0, "refused": 0}
    for seed in range(160):
        r = random.Random(seed)
        path = tmp_path / f"c{seed}.yaml"
        path.write_text(yaml.safe_dump(_cluster(r)))
        cluster = load_cluster(path)
        try:
            plan = plan_profile(_profile(r), cluster)
        except ConfigError as exc:
            assert "\n" not in str(exc), (seed, str(exc))
            outcomes["refused"] += 1
            continue
        assert plan.events <= cluster.simulate.max_events, seed
        for p in (plan.current, plan.best, *plan.searched):
            assert math.isfinite(p.steps_per_hour) and p.steps_per_hour > 0, seed
            assert all(math.isfinite(u) for u in p.utilisation.values()), seed
        outcomes["planned"] += 1
    assert min(outcomes.values()) >= 20, outcomes  # the generator reaches both sides


def _sim(shape: Shape, costs: Costs | None = None) -> Simulation:
    sample = GroupSample("d", 10, 0.0, 1.0, 0.1, 0.5)
    return Simulation({"d": [sample]}, {"d": 1.0}, costs or Costs(100.0, 1, 0.0, [1], [0.1], 8, 2), shape)


def test_a_simulation_stops_at_its_event_budget_and_its_deadline():
    shape = Shape("sync", 0, 4, 64, 64, 8, (1, 1, 1))
    with pytest.raises(ConfigError, match=r"simulate\.max_events"):
        _sim(shape).run(1000, max_events=50)
    with pytest.raises(ConfigError, match=r"simulate\.deadline_s"):
        _sim(shape).run(1000, deadline=-math.inf)  # a deadline already past
    assert _sim(shape).run(3, max_events=10_000).events <= 10_000


def test_a_shape_that_can_never_train_is_refused_before_simulating():
    # async admits at most min(max_inflight, (k + 1) x p) = 2 untrained groups; a step trains 3
    with pytest.raises(ConfigError, match=r"set pipeline\.max_inflight >= 3"):
        plan_profile(
            _profile(random.Random(0)),
            ClusterConfig.model_validate({"pipeline": {"mode": "async", "max_inflight": 2, "prompts_per_step": 3}}),
        )


def test_a_plan_over_its_event_budget_is_refused_up_front():
    cluster = ClusterConfig.model_validate({"simulate": {"steps": 100_000, "replicas": 1000}})
    with pytest.raises(ConfigError, match=r"over simulate\.max_events"):
        plan_profile(_profile(random.Random(0)), cluster)


def test_non_finite_rates_are_refused_by_the_cluster_file(tmp_path):
    path = tmp_path / "c.yaml"
    for bad in ("engines: {tokens_per_s: .inf}", "trainer: {tokens_per_s: .nan}", "trainer: {step_overhead_s: .inf}"):
        path.write_text(bad + "\n")
        with pytest.raises(ConfigError, match="finite"):
            load_cluster(path)


def test_plan_command_refuses_with_one_line_and_exit_code_2(tmp_path, capsys):
    from test_plan import _write_run

    from posttrain.cli import main

    _write_run(tmp_path / "run")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("pipeline: {mode: async, max_inflight: 1}\nsimulate: {steps: 5, search_steps: 5, replicas: 1}\n")
    assert main(["plan", str(tmp_path / "run"), "--cluster", str(cluster)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("posttrain plan: error: mode async admits at most 1"), err


def test_the_docs_example_cluster_file_plans_a_demo_run_within_its_event_bound(tmp_path):
    # the README's tour runs `posttrain plan runs/RUN --cluster FILE` with docs/scale-out.md's example on
    # a demo run (32 groups of 8 a step); with search_steps 60 it needed 2,696,064 events and was refused
    from pathlib import Path

    from posttrain.plan import events_bound

    doc = (Path(__file__).parents[2] / "docs" / "scale-out.md").read_text()
    example = doc.split("**Describing a cluster**", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "cluster.yaml").write_text(example)
    cluster = load_cluster(tmp_path / "cluster.yaml")
    p = cluster.pipeline
    shape = Shape(p.mode or "sync", p.max_staleness or 0, 32, 64, 256, 8, (2, 16, 2))
    need = events_bound(cluster, shape, group_size=8)
    assert need == 1_549_104 and need <= cluster.simulate.max_events
