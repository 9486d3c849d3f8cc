"""The capacity planner: distributions read from a synthetic run with known timings, the
simulator against closed-form cases, the search on a constructed case, the cluster file's
errors, and `posttrain plan` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.configs.cluster import ClusterConfig, load_cluster
from posttrain.errors import ConfigError
from posttrain.plan import plan_profile, plan_run
from posttrain.plan.profile import GroupSample, Profile, RunShape, load_profile
from posttrain.plan.sim import Costs, Shape, Simulation
from posttrain.trace import RolloutRecord, TraceStore

G = 2


def _write_run(run: Path) -> None:
    """A finished sync run: 3 steps of 2 groups (G=2). Domain `slow`: execute 2.0 s, verify
    0.1 s, 10 tokens per rollout; domain `fast`: no execution, verify 0.01 s, 5 tokens. Each
    step's two groups share one generation call of 0.5 s. Train rows: 100 tokens, 0.2 s each,
    1.0 s wall past the sampling."""
    run.mkdir()
    store = TraceStore(run / "trace.db")
    recs = []
    for step in range(1, 4):
        for k, (domain, exec_s, verify_s, tokens) in enumerate((("slow", 2.0, 0.1, 10), ("fast", 0.0, 0.01, 5))):
            timings = {"generate_s": 0.5, "execute_s": exec_s, "verify_s": verify_s, "total_s": 3.0, "queue_s": 0.0}
            for _ in range(G):
                recs.append(
                    RolloutRecord(
                        f"t{step}{k}",
                        domain,
                        "train",
                        1,
                        "v",
                        f"{step}:{k}",
                        step - 1,
                        {},
                        "p",
                        "c",
                        tokens,
                        "stop",
                        1.0,
                        True,
                        {},
                        "",
                        "x",
                        timings,
                    )
                )
    store.write_rollouts(recs)
    store.close()
    (run / "config.yaml").write_text(
        "rollout: {prompts_per_step: 2, group_size: 2}\npipeline: {execute_workers: 1, mode: sync}\n"
        "sandbox: {workers: 8}\n"
    )
    rows = [{"kind": "eval", "step": 0, "time": 100.0}]
    for step in range(1, 4):
        rows.append(
            {
                "kind": "train",
                "step": step,
                "time": 100.0 + 4.0 * step,
                "rollout_s": 2.8,
                "seconds": 0.2,
                "n_tokens": 100,
            }
        )
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_profile_reads_known_timings(tmp_path):
    _write_run(tmp_path / "run")
    p = load_profile(tmp_path / "run")
    assert len(p.groups) == 6 and p.calls == 3
    assert sorted(p.by_domain) == ["fast", "slow"]
    slow = p.summary()["slow"]
    assert slow["share"] == pytest.approx(0.5) and slow["tokens_mean"] == pytest.approx(20)
    assert slow["execute_s_mean"] == pytest.approx(2.0) and slow["verify_s_mean"] == pytest.approx(0.1)
    assert p.summary()["fast"]["execute_s_max"] == 0.0
    # one execute worker ran the group's two programs one after the other: 1.0 s each
    assert {g.program_s for g in p.by_domain["slow"]} == {1.0}
    # each call: (20 + 10) tokens in 0.5 s
    assert p.tokens_per_s == pytest.approx(60.0)
    assert p.train_s_per_token == pytest.approx(0.2 / 100)
    # wall 4.0 s per step, less 2.8 s of sampling, less 0.2 s of the optimiser step
    assert p.overhead_s == pytest.approx([1.0, 1.0, 1.0])
    assert p.shape.mode == "sync" and p.shape.workers == (1, 1, 2) and p.shape.sandbox_slots == 8


def _costs(tokens_per_s=1e9, train_s=0.0, overhead=0.0, slots=64, engines=1) -> Costs:
    return Costs(tokens_per_s, engines, train_s, [1], [overhead], slots, G)


def _shape(mode="async", k=100, p=4, workers=(1, 1, 1), inflight=1000, queue=1000) -> Shape:
    return Shape(mode, k, p, queue, inflight, 64, workers)


def _one(exec_s: float, verify_s: float = 0.0, tokens: int = 1) -> dict[str, list[GroupSample]]:
    """One group sample whose G programs take exec_s / G each: exec_s on one program slot."""
    return {"d": [GroupSample("d", tokens, 0.0, exec_s, verify_s, exec_s / G)]}


@pytest.mark.parametrize("workers", [1, 3, 8])
def test_deterministic_pipeline_runs_at_its_slowest_stage(workers):
    # execute 2.0 s per group (two 1.0 s programs) on `workers` workers and as many program
    # slots, verify 0.5 s on one: the stages' rates are workers / 2.0 and 1 / 0.5 groups per
    # second; throughput is the smaller, over 4 groups a step.
    sim = Simulation(_one(2.0, 0.5), {"d": 1.0}, _costs(), _shape(workers=(1, workers, 1)))
    res = sim.run(300)
    rate = min(workers / 2.0, 1 / 0.5)
    assert res.steps_per_hour == pytest.approx(3600 * rate / 4, rel=0.02)
    assert res.bottleneck == ("execute" if workers < 4 else "verify")
    assert res.utilisation[res.bottleneck] == pytest.approx(1.0, abs=0.02)


def test_generation_rate_bounds_throughput():
    # 100 tokens a group at 50 tokens/s on one engine: 2 s per group, the generate stage binds
    sim = Simulation(_one(0.1, tokens=100), {"d": 1.0}, _costs(tokens_per_s=50.0), _shape(k=1, p=2))
    res = sim.run(200)
    assert res.steps_per_hour == pytest.approx(3600 / (2 * 2.0), rel=0.02) and res.bottleneck == "generate"


def test_sync_barrier_is_the_slowest_group_plus_the_step():
    # sync: each step waits for its slowest group (its 2 programs each last the group's time, all
    # 4 x 2 programs run at once on 8 workers' slots), then
    # trains for 0.3 s + 0.2 s overhead: step time = max(latencies) + 0.5.
    groups = {"d": [GroupSample("d", 1, 0.0, e, 0.0, e) for e in (0.5, 1.0, 4.0)]}
    sim = Simulation(groups, {"d": 1.0}, _costs(train_s=0.3, overhead=0.2), _shape("sync", 0, 4, (1, 8, 1)), seed=3)
    res = sim.run(50)
    for rec in res.steps:
        assert rec.end - rec.start == pytest.approx(max(rec.latencies) + 0.5)
    assert any(max(r.latencies) == pytest.approx(4.0) for r in res.steps)
    assert any(max(r.latencies) < 4.0 for r in res.steps)


def test_staleness_bound_limits_overlap():
    # async, training costs 1 s, execution 1 s on many workers: with k = 0 groups of the next
    # step are admitted only after the step trained (serial: 2 s a step); with k = 1 the next
    # step's groups execute while this one trains (1 s a step).
    one = {"d": [GroupSample("d", 1, 0.0, 1.0, 0.0, 1.0)]}  # programs of 1 s, all at once on 64 slots
    serial = Simulation(one, {"d": 1.0}, _costs(overhead=1.0), _shape(k=0, workers=(1, 64, 1))).run(100)
    overlap = Simulation(one, {"d": 1.0}, _costs(overhead=1.0), _shape(k=1, workers=(1, 64, 1))).run(100)
    assert serial.steps_per_hour == pytest.approx(3600 / 2.0, rel=0.02)
    assert overlap.steps_per_hour == pytest.approx(3600 / 1.0, rel=0.03)


def test_full_queue_holds_the_upstream_worker():
    # queue of 1 before a 1 s verify: generation never runs ahead more than the queue allows,
    # and throughput stays the verify rate (no group lost or double counted)
    res = Simulation(_one(0.0, 1.0), {"d": 1.0}, _costs(), _shape(queue=1, p=1)).run(100)
    assert res.steps_per_hour == pytest.approx(3600.0, rel=0.02)


def _profile(groups: list[GroupSample], mode="async", k=4) -> Profile:
    shape = RunShape(mode, k, 4, 2, 64, 256, 64, (1, 1, 1), 64)
    return Profile(groups, shape, tokens_per_s=100.0, train_s_per_token=0.0, train_tokens=[1], overhead_s=[0.0])


def test_search_moves_workers_to_the_slow_stage():
    # execute 2 s a group (two 1 s programs), verify 0.1 s, generation 0.05 s: with 8 workers in
    # all the best split gives execution everything it can (1/6/1: 3 groups/s), and it beats the
    # cluster's 2/2/4 (2 program slots: 1 group/s)
    profile = _profile([GroupSample("d", 5, 0.05, 2.0, 0.1, 1.0)])
    cluster = ClusterConfig.model_validate(
        {
            "workers": {"generate": 2, "execute": 2, "verify": 4},
            "search": {"generate": [1, 2], "execute": [1, 2, 4, 6], "verify": [1, 2, 4], "max_workers": 8},
            "simulate": {"steps": 80, "search_steps": 80, "replicas": 1},
        }
    )
    plan = plan_profile(profile, cluster)
    assert plan.best.workers == (1, 6, 1)
    assert plan.best.steps_per_hour > 2.5 * plan.current.steps_per_hour
    assert plan.current.bottleneck == "execute"
    assert all(sum(p.workers) <= 8 for p in plan.searched)


def test_the_best_is_never_slower_than_the_clusters_own_split():
    """The search's splits leave out the cluster's 1/6/1 (execute capped at 2 workers): its row
    was faster than every searched one, and the "best" row was slower than the cluster's."""
    profile = _profile([GroupSample("d", 5, 0.05, 2.0, 0.1, 1.0)])
    cluster = ClusterConfig.model_validate(
        {
            "workers": {"generate": 1, "execute": 6, "verify": 1},
            "search": {"generate": [1, 2], "execute": [1, 2], "verify": [1, 2], "max_workers": 8},
            "simulate": {"steps": 40, "search_steps": 40, "replicas": 1},
        }
    )
    plan = plan_profile(profile, cluster)
    assert max(p.steps_per_hour for p in plan.searched) < plan.current.steps_per_hour
    assert plan.best == plan.current


def test_cluster_file_errors_name_the_field(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("engines: {count: 0}\nsandbox_slot: 3\n")
    with pytest.raises(ConfigError, match=r"engines\.count.*sandbox_slot: unknown field"):
        load_cluster(bad)
    bad.write_text("trainer: {tokens_per_s: fast}\n")
    with pytest.raises(ConfigError, match="trainer.tokens_per_s"):
        load_cluster(bad)
    bad.write_text("search: {execute: []}\n")
    with pytest.raises(ConfigError, match="search.execute must list"):
        load_cluster(bad)
    bad.write_text("search: {max_workers: 3, generate: [2], execute: [2], verify: [2]}\n")
    with pytest.raises(ConfigError, match="leaves no split"):
        load_cluster(bad)
    bad.write_text("pipeline: {mode: sync, max_staleness: 2}\n")
    with pytest.raises(ConfigError, match="sync is on-policy"):
        load_cluster(bad)
    bad.write_text("[1, 2]\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_cluster(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_cluster(tmp_path / "missing.yaml")
    good = tmp_path / "g.json"
    good.write_text('{"engines": {"count": 2, "tokens_per_s": 500}, "workers": {"execute": 8}}')
    assert load_cluster(good).engines.tokens_per_s == 500.0


def test_plan_of_a_run_that_is_not_one(tmp_path):
    with pytest.raises(ConfigError, match="no trace.db"):
        plan_run(tmp_path, ClusterConfig())


def test_plan_command_end_to_end(tmp_path, capsys):
    from posttrain.cli import main

    _write_run(tmp_path / "run")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(
        "workers: {generate: 1, execute: 1, verify: 1}\n"
        "search: {generate: [1], execute: [1, 2], verify: [1]}\n"
        "simulate: {steps: 20, search_steps: 20, replicas: 1}\n"
    )
    out = tmp_path / "plan.json"
    assert main(["plan", str(tmp_path / "run"), "--cluster", str(cluster), "--json", str(out)]) == 0
    assert "| slow | 50% |" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["measured"]["engine_tokens_per_s"] == pytest.approx(60.0)
    assert data["shape"] == {"mode": "sync", "max_staleness": 0, "prompts_per_step": 2}
    # a step is at least one 0.5 s call, one 2 s execution, 0.1 s of verification and 1.2 s of step
    assert data["current"]["step_s_mean"] >= 3.8 - 1e-9
    assert data["best"]["steps_per_hour"] >= data["current"]["steps_per_hour"] * 0.99
    assert (tmp_path / "run" / "plan.png").stat().st_size > 1000


def test_replay_follows_the_runs_order():
    # replay: the run's groups in order, cycled; one group a step, its two programs one after
    # the other on one slot: 1, 3, 1, 3 s
    order = [GroupSample("d", 1, 0.0, 1.0, 0.0, 0.5), GroupSample("d", 1, 0.0, 3.0, 0.0, 1.5)]
    sim = Simulation({"d": order}, {"d": 1.0}, _costs(), _shape("sync", 0, 1), order=order)
    res = sim.run(4)
    assert [round(r.end - r.start, 6) for r in res.steps] == [1.0, 3.0, 1.0, 3.0]
