"""bench/peer.py's pure parts: arguments, per-step medians, gains, ratios, the issue's criteria, and the
TRL side's reward function (posttrain's verifiers). The TRL run itself needs the peer venv
(`make bench-peer`) and is marked slow; it is skipped when that venv is absent."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
from bench_loader import load

ROOT = Path(__file__).resolve().parents[2]
PEER_PYTHON = ROOT / ".venv-peer" / "bin" / "python"


peer = load("peer")
peer_trl = load("peer_trl")


def _row(wall, gen, ver, train, cpu):
    return {
        "wall_s": wall,
        "generate_s": gen,
        "verify_s": ver,
        "train_s": train,
        "other_s": wall - gen - ver - train,
        "step_cpu_s": cpu,
    }


def _figures(gain_per_min, wall_ms, cpu_ms, curve, half_width=0.04):
    return {
        "gain_per_cpu_min": gain_per_min,
        "ms": {"wall": wall_ms, "cpu": cpu_ms, "generate": 1.0, "train": 1.0},
        "curve": curve,
        "half_width": half_width,
    }


# ---------------------------------------------------------------- arguments


def test_defaults_are_the_issues_settings():
    a = peer.parse_args([])
    assert (a.seeds, a.mixes, a.threads, a.budget_cpu_s, a.save_every, a.jobs) == (
        [0],
        ["demo", "buggier"],
        [1],
        105.0,
        25,
        1,
    )


def test_every_mix_config_loads_and_names_its_own_base():
    from posttrain.configs import load_config

    bases = {}
    for name, mix in peer.MIXES.items():
        cfg = load_config(peer.ROOT / mix.config, list(mix.overrides))
        assert cfg.tasks.domains, name
        bases[name] = cfg.base
    assert bases["buggier"].buggy_fraction == 0.98 and bases["demo"].buggy_fraction == 0.75
    assert bases["buggier"].domains == bases["demo"].domains  # the same tasks, a buggier base
    args = peer.parse_args(["--model", "/some/base"])
    assert peer.base_model(args, peer.MIXES["buggier"]) == peer.Path("/some/base")  # --model wins for every mix


def test_arguments_parse():
    a = peer.parse_args(
        ["--seeds", "0", "1", "2", "--mixes", "hard", "--threads", "1", "2", "--budget-cpu-s", "60", "--jobs", "2"]
    )
    assert (a.seeds, a.mixes, a.threads, a.budget_cpu_s, a.jobs) == ([0, 1, 2], ["hard"], [1, 2], 60.0, 2)
    assert [(u.mix.name, u.threads, u.seed) for u in peer.units_of(a)] == [
        ("hard", 1, 0),
        ("hard", 1, 1),
        ("hard", 1, 2),
        ("hard", 2, 0),
        ("hard", 2, 1),
        ("hard", 2, 2),
    ]


@pytest.mark.parametrize(
    "bad",
    [
        ["--budget-cpu-s", "0"],
        ["--save-every", "0"],
        ["--jobs", "0"],
        ["--threads", "0"],
        ["--seeds", "1", "1"],
        ["--mixes", "nope"],
    ],
)
def test_bad_arguments_exit_2(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        peer.parse_args(bad)
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_mixes_are_valid_posttrain_configs():
    from posttrain.configs import load_config

    for mix in peer.MIXES.values():
        cfg = load_config(ROOT / mix.config, [*mix.overrides, *peer.EVAL_OVERRIDES])
        assert cfg.eval.every_steps == 0 and cfg.eval.samples == 0
    hard = load_config(ROOT / peer.MIXES["hard"].config, list(peer.MIXES["hard"].overrides))
    assert {n: s.weight for n, s in hard.tasks.domains.items()} == {"add": 1, "sub": 1, "reverse": 3, "sort": 3}
    harder = load_config(ROOT / peer.MIXES["harder"].config, list(peer.MIXES["harder"].overrides))
    demo = load_config(ROOT / "configs" / "default.yaml")
    assert harder.base == demo.base  # the same embedded base (its cache key is the base section)
    assert any(s.difficulty and s.difficulty > 1 for s in harder.tasks.domains.values())


# ---------------------------------------------------------------- summaries


def test_step_medians_skip_the_first_step_and_split_the_wall():
    rows = [
        _row(9.0, 5.0, 1.0, 2.0, 9.0),  # warm-up, left out
        _row(0.3, 0.1, 0.01, 0.15, 0.25),
        _row(0.5, 0.2, 0.03, 0.2, 0.45),
        _row(0.4, 0.12, 0.02, 0.2, 0.3),
    ]
    ms = peer.step_medians(rows)
    # medians of steps 2-4: wall (300, 400, 500) -> 400; generate (100, 120, 200) -> 120; verify 20;
    # train (150, 200, 200) -> 200; other (40, 60, 70) -> 60; cpu (250, 300, 450) -> 300
    expect = {"wall": 400, "generate": 120, "verify": 20, "train": 200, "other": 60, "cpu": 300}
    assert ms == pytest.approx(expect)
    assert peer.step_medians(rows[:1])["wall"] == pytest.approx(9000)  # one step: nothing to skip


def test_system_figures_gain_per_cpu_minute_and_curve():
    rows = [{**_row(0.6, 0.2, 0.01, 0.35, 0.6), "step": i, "cpu_s": 30.0 * i} for i in (1, 2, 3)]
    run = {
        "system": "trl",
        "steps": 3,
        "cpu_s": 90.0,
        "budget_cpu_s": 90.0,
        "peak_rss_mib": 800.0,
        "step_rows": rows,
        "checkpoints": {"1": "c1", "2": "c2", "3": "c3"},
    }
    evals = {
        "base": {"mean": 0.20, "ci": [0.16, 0.24]},
        "trl:final": {"mean": 0.35, "ci": [0.30, 0.40]},
        "trl:step2": {"mean": 0.30},
        "trl:step1": {"mean": 0.26},
        "posttrain:step1": {"mean": 0.9},
    }
    f = peer.system_figures(run, evals)
    # gain 0.35 - 0.20 = 15 points over 90 CPU-s = 1.5 CPU-minutes: 10 points per CPU-minute
    assert f["gain_pp"] == pytest.approx(15.0)
    assert f["gain_per_cpu_min"] == pytest.approx(10.0)
    assert f["curve"] == {1: 0.26, 2: 0.30}  # its own checkpoints only, by step
    assert f["half_width"] == pytest.approx(0.05)
    assert f["ms"]["wall"] == pytest.approx(600)
    # gain against CPU: base (0, 0), step 1 at 30 s +6, step 2 at 60 s +10, final at 90 s +15
    assert [c for c, _ in f["cpu_curve"]] == [0.0, 30.0, 60.0, 90.0]
    assert [g for _, g in f["cpu_curve"]] == pytest.approx([0.0, 6.0, 10.0, 15.0])
    # 1/3 of the budget is 30 CPU-s: +6 points in 0.5 min = 12 per CPU-minute; 2/3: 60 s, +10 in 1 min
    assert f["at_cpu"]["0.33"] == pytest.approx({"cpu_s": 30.0, "gain_pp": 6.0, "gain_per_cpu_min": 12.0})
    assert f["at_cpu"]["0.67"] == pytest.approx({"cpu_s": 60.0, "gain_pp": 10.0, "gain_per_cpu_min": 10.0})


def test_gain_at_and_cpu_to_reach_interpolate_between_checkpoints():
    points = [(0.0, 0.0), (20.0, 10.0), (40.0, 8.0), (60.0, 20.0)]
    assert peer.gain_at(points, 10.0) == pytest.approx(5.0)  # halfway from 0 to +10
    assert peer.gain_at(points, 50.0) == pytest.approx(14.0)  # 8 + (20 - 8) / 2
    assert peer.gain_at(points, 61.0) is None  # past the run's end
    # +9 is first reached between 0 and 20 s (at 18 s), not on the later climb through +9 at 45 s
    assert peer.cpu_to_reach(points, 9.0) == pytest.approx(18.0)
    assert peer.cpu_to_reach(points, 14.0) == pytest.approx(50.0)  # 40 + 20 * (14 - 8) / 12
    assert peer.cpu_to_reach(points, 21.0) is None
    assert peer.cpu_to_reach(points, -1.0) == 0.0  # a target at or below zero: reached at the start


def test_cpu_to_reach_counts_a_gain_equal_in_items_but_not_in_the_last_bits():
    # seed 1 of the real mix, 2026-12-05: posttrain's step 12 passed 28 of the 48 items (6 + 22), as TRL's final
    # did (4 + 24); the two means' last bits differ (+24.999999999999993 against TRL's +25.000000000000007)
    points = [(0.0, 0.0), (608.9, 22.916666666666668), (710.7, 24.999999999999993), (807.3, 20.833333333333332)]
    assert peer.cpu_to_reach(points, 25.000000000000007) == pytest.approx(710.7)
    assert peer.cpu_to_reach(points, 25.01) is None  # a real shortfall still is one


def test_reach_uses_each_seeds_trl_final_gain():
    seeds = {
        0: {
            "posttrain": {"cpu_curve": [(0.0, 0.0), (10.0, 20.0)]},
            "trl": {"gain_pp": 10.0, "cpu_curve": [(0.0, 0.0), (40.0, 10.0)]},
        }
    }
    r = peer.reach(seeds)
    # half of TRL's +10: posttrain at 2.5 s, TRL at 20 s (speed-up 8); all of it: 5 s against 40 s
    assert r["0.5"][0] == pytest.approx({"target_pp": 5.0, "posttrain": 2.5, "trl": 20.0, "speedup": 8.0})
    assert r["1"][0] == pytest.approx({"target_pp": 10.0, "posttrain": 5.0, "trl": 40.0, "speedup": 8.0})


def test_spread_prints_mean_and_range_or_what_is_missing():
    assert peer.spread([1.0, 2.0, 6.0]) == "3.00 [1.00, 6.00]"
    assert peer.spread([4.0]) == "4.00"
    assert peer.spread([10.0, 20.0]) == "15.0 [10.0, 20.0]"
    assert peer.spread([1.0, None]) == "n/a (1.0, -)"
    assert peer.spread([]) == "-"


def test_verdicts_on_the_seed_mean():
    seeds = {
        0: {
            "posttrain": _figures(12.0, 100.0, 90.0, {25: 0.40, 50: 0.50}),
            "trl": _figures(5.0, 400.0, 300.0, {25: 0.42, 50: 0.45, 100: 0.5}),
        },
        1: {
            "posttrain": _figures(8.0, 140.0, 110.0, {25: 0.30, 50: 0.46}),
            "trl": _figures(5.0, 440.0, 300.0, {25: 0.36, 50: 0.47}),
        },
    }
    v = peer.verdicts(seeds)
    # gain: mean(12, 8) / mean(5, 5) = 10 / 5 = 2.0 -> met (>= 2)
    assert v["gain_ratio"] == pytest.approx(2.0) and v["gain_ok"]
    # step: mean(100, 140) / mean(400, 440) = 120 / 420 = 0.2857 -> met (<= 1/3); cpu 100 / 300
    assert v["step_ratio_wall"] == pytest.approx(120 / 420) and v["step_ok"]
    assert v["step_ratio_cpu"] == pytest.approx(1 / 3)
    # curve at the steps every run reached (25, 50): 25 -> mean(-0.02, -0.06) = -0.04; 50 -> mean(+0.05, -0.01) = +0.02
    assert v["curve_diffs"] == pytest.approx({25: -0.04, 50: 0.02})
    # noise: half-width 0.04 / sqrt(2 seeds) = 0.0283; -0.04 is below it -> not met
    assert v["noise"] == pytest.approx(0.04 / math.sqrt(2))
    assert v["curve_ok"] is False
    # paired by seed over steps 25 and 50: seed 0 mean(-0.02, +0.05) = +0.015, seed 1 mean(-0.06, -0.01) = -0.035;
    # mean -0.01, standard error = stdev(+0.015, -0.035) / sqrt(2) = 0.0354 / 1.414 = 0.025
    assert v["paired"]["per_seed"] == pytest.approx([0.015, -0.035])
    assert v["paired"]["mean"] == pytest.approx(-0.01) and v["paired"]["se"] == pytest.approx(0.025)
    # seeds in the order they ran (1 before 0): the per-seed list is still in seed order
    assert peer.verdicts({1: seeds[1], 0: seeds[0]})["paired"]["per_seed"] == pytest.approx([0.015, -0.035])


def test_verdicts_not_met_and_no_common_step():
    seeds = {0: {"posttrain": _figures(6.0, 300.0, 250.0, {}), "trl": _figures(5.0, 600.0, 500.0, {25: 0.3})}}
    v = peer.verdicts(seeds)
    assert v["gain_ratio"] == pytest.approx(1.2) and not v["gain_ok"]
    assert v["step_ratio_wall"] == pytest.approx(0.5) and not v["step_ok"]
    assert v["curve_diffs"] == {} and v["curve_ok"] is None
    assert v["paired"] == {"per_seed": [], "mean": None, "se": None}


def test_ratio_guards_zero_and_missing():
    assert peer.ratio(1.0, 0.0) is None and peer.ratio(None, 2.0) is None
    assert peer.ratio(3.0, 2.0) == pytest.approx(1.5)


def test_report_prints_ratios_side_by_side():
    run = {
        "steps": 10,
        "cpu_s": 60.0,
        "before": 0.2,
        "after": 0.3,
        "gain_pp": 10.0,
        "peak_rss_mib": 500.0,
        "ms": {"wall": 200.0, "generate": 50.0, "verify": 1.0, "train": 100.0, "other": 49.0, "cpu": 150.0},
        "at_cpu": {},
        "cpu_curve": [(0.0, 0.0), (60.0, 10.0)],
    }
    pt = {**run, "gain_per_cpu_min": 10.0, "curve": {25: 0.3}, "half_width": 0.04}
    trl = {
        **run,
        "gain_per_cpu_min": 4.0,
        "curve": {25: 0.25},
        "half_width": 0.04,
        "ms": {**run["ms"], "wall": 800.0, "cpu": 600.0},
        "peak_rss_mib": 1000.0,
    }
    block = {"why": "test mix", "seeds": {"0": {"posttrain": pt, "trl": trl}}}
    block["verdicts"] = peer.verdicts({0: block["seeds"]["0"]})
    text = peer.report({"demo/threads1": block})
    assert "| 0 | 2.50x | 0.25x | 0.25x | 1.00x | 1.00x | 0.50x |" in text  # 10/4, 200/800, 150/600, ..., 500/1000
    assert "**2.50x** (target >= 2x): met" in text
    assert "**0.25x** wall, 0.25x CPU (target <= 0.33x): met" in text
    assert "| posttrain - TRL | +0.050 |" in text
    assert "| gain (pp) at the full budget | 10.0 | 10.0 | 1.00 |" in text
    # both reach TRL's final +10 at 60 CPU-s; half of it at 30 s
    assert "| CPU-s to reach TRL's final gain (TRL/posttrain: speed-up) | 60.0 | 60.0 | 1.00 |" in text
    assert "| gain (pp) at CPU-s | 10 | 20 | 30 | 40 | 50 | 60 |" in text
    assert "| posttrain (mean of seeds) | +1.7 | +3.3 | +5.0 | +6.7 | +8.3 | +10.0 |" in text


def test_order_check():
    assert peer.order_check({"task_ids": ["a", "b", "c"]}, {"task_ids": ["a", "b"]}) == {
        "compared": 2,
        "first_mismatch": None,
    }
    assert peer.order_check({"task_ids": ["a", "x"]}, {"task_ids": ["a", "b"]})["first_mismatch"] == 1


def test_evals_of_both_sides_merge_only_when_both_exist(tmp_path):
    (tmp_path / "evals-trl.json").write_text(json.dumps({"base": {"mean": 0.1}, "trl:final": {"mean": 0.3}}))
    assert peer.load_evals(tmp_path) is None  # posttrain not evaluated yet
    pt = {"base": {"mean": 0.1}, "posttrain:final": {"mean": 0.4}}
    (tmp_path / "evals-posttrain.json").write_text(json.dumps(pt))
    assert set(peer.load_evals(tmp_path)) == {"base", "trl:final", "posttrain:final"}


def test_heldout_file_is_the_set_posttrain_eval_builds(tmp_path):
    from posttrain.configs import load_config
    from posttrain.evaluate.run import heldout_for
    from posttrain.tasks.pool import TaskPool

    mix = peer.MIXES["harder"]
    path = peer.heldout_file(tmp_path, mix)
    cfg = load_config(ROOT / mix.config, [*mix.overrides, *peer.EVAL_OVERRIDES, "run.seed=7"])  # seed-independent
    pool = TaskPool(cfg.tasks, seed=7)
    heldout_for(cfg.eval, {n: pool.eval_difficulty(n) for n in pool.names}).save(tmp_path / "direct.json")
    assert json.loads(path.read_text()) == json.loads((tmp_path / "direct.json").read_text())
    assert peer.same_heldout(tmp_path, mix, {"heldout": str(tmp_path / "direct.json")}) is True


def _run_eval_job(tmp_path, domains: str, models: dict[str, str], **extra) -> dict:
    """`peer.py _eval JOB` run for real on a stored held-out set of `domains` (2 tasks each) of the
    default config, over `models` (label -> folder), `extra` added to the job; its evals.json."""
    from posttrain.configs import load_config
    from posttrain.evaluate.run import heldout_for
    from posttrain.tasks.pool import TaskPool

    overrides = [f"tasks.domains={domains}", "eval.tasks_per_domain=2"]
    cfg = load_config(ROOT / "configs" / "default.yaml", [*overrides, *peer.EVAL_OVERRIDES])
    pool = TaskPool(cfg.tasks, seed=cfg.run.seed)
    heldout_for(cfg.eval, {n: pool.eval_difficulty(n) for n in pool.names}).save(tmp_path / "heldout.json")
    job = {
        "config": str(ROOT / "configs" / "default.yaml"),
        "overrides": overrides,
        "heldout": str(tmp_path / "heldout.json"),
        "models": models,
        "out": str(tmp_path),
        **extra,
    }
    (tmp_path / "job.json").write_text(json.dumps(job))
    assert peer.eval_worker([str(tmp_path / "job.json")]) == 0
    return json.loads((tmp_path / "evals.json").read_text())


def test_the_eval_worker_evaluates_a_model_through_posttrain_eval(micro_base, tmp_path):
    """The worker both sides' evaluations go through (`peer.py _eval JOB`), run for real on a stored set:
    it gave every model AttributeError once `posttrain eval` gained an option its hand-built arguments lacked."""
    base = _run_eval_job(tmp_path, "{add: {}, reverse: {}}", {"base": micro_base})["base"]
    assert set(base["domains"]) == {"add", "reverse"} and 0.0 <= base["mean"] <= 1.0


def test_step_clock_splits_and_stops_at_the_budget(monkeypatch):
    clock = peer.StepClock(budget_cpu_s=1.0)
    cpu = iter([10.0, 10.4, 11.2])  # start, end of step 1 (0.4 used), end of step 2 (1.2 used)
    wall = iter([100.0, 100.5, 101.5])
    monkeypatch.setattr(peer.time, "process_time", lambda: next(cpu))
    monkeypatch.setattr(peer.time, "perf_counter", lambda: next(wall))
    clock.start()
    clock.add("generate", 0.2)
    clock.add("train", 0.25)
    assert clock.end_step(1) is False
    assert clock.rows[0] == pytest.approx(
        {
            "step": 1,
            "wall_s": 0.5,
            "generate_s": 0.2,
            "verify_s": 0.0,
            "train_s": 0.25,
            "other_s": 0.05,
            "cpu_s": 0.4,
            "step_cpu_s": 0.4,
        }
    )
    assert clock.end_step(2) is True and not clock.running
    assert clock.rows[1]["step_cpu_s"] == pytest.approx(0.8) and clock.rows[1]["wall_s"] == pytest.approx(1.0)
    clock.add("verify", 5.0)  # after the stop nothing is counted (the final evaluation)
    assert clock.acc["verify"] == 0.0


# ---------------------------------------------------------------- the TRL side's pure parts


def test_trl_reward_is_posttrains_verifier():
    from posttrain.configs import load_config

    cfg = load_config(ROOT / "configs" / "default.yaml")
    tasks = peer_trl.draw_tasks(cfg, 1)
    assert len(tasks) == cfg.rollout.prompts_per_step and all(t.meta.split == "train" for t in tasks)
    reward = peer_trl.reward_function(tasks, max_tokens=16, eos_ids={2})
    gold = [[{"role": "assistant", "content": str(t.reference)}] for t in tasks[:3]]
    wrong = [[{"role": "assistant", "content": str(t.reference) + "9"}] for t in tasks[:3]]
    got = reward(
        prompts=[None] * 6, completions=gold + wrong, completion_ids=[[5, 2]] * 6, task_index=[0, 1, 2, 0, 1, 2]
    )
    assert got == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]


def test_trl_reward_marks_infra_errors_none(raising_domain):
    from posttrain.types import Message, Task, TaskMeta

    task = Task(
        id="x",
        domain=raising_domain("test_peer_boom").name,  # raises on every answer, the gold's too: the verifier's fault
        prompt=(Message("user", "1+0="),),
        reference="1",
        meta=TaskMeta(split="train", difficulty=1, source="test", taskset_version="v"),
    )
    reward = peer_trl.reward_function([task], max_tokens=16, eos_ids={2})
    assert reward(prompts=[None], completions=["1"], completion_ids=[[5]], task_index=[0]) == [None]


def test_trl_draws_posttrains_task_order():
    from posttrain.configs import load_config
    from posttrain.tasks.pool import TaskPool

    cfg = load_config(ROOT / "configs" / "default.yaml", ["run.seed=3"])
    pool = TaskPool(cfg.tasks, seed=3)
    expect = [t.id for _ in range(2) for t in pool.draw(cfg.rollout.prompts_per_step)]
    assert [t.id for t in peer_trl.draw_tasks(cfg, 2)] == expect


def test_timed_trainer_adds_each_methods_wall_time():
    class Fake:
        def _generate(self, prompts):
            return ["out", *prompts]

        def _calculate_rewards(self, *a, **k):
            return 1.0

        def _generate_and_score_completions(self, *a, **k):
            return self._generate(["p"])

        def training_step(self, *a, **k):
            self._generate_and_score_completions()
            raise RuntimeError("boom")  # timed all the same

    clock = peer_trl.StepClock(budget_cpu_s=10.0)
    trainer = peer_trl.timed_trainer(Fake, clock)()
    assert trainer._generate(["a"]) == ["out", "a"] and trainer._calculate_rewards() == 1.0
    with pytest.raises(RuntimeError):
        trainer.training_step()
    assert all(v > 0 for v in clock.acc.values())
    assert clock.acc["training_step"] >= clock.acc["gen_score"] and clock.training_step_end > 0


# ---------------------------------------------------------------- the real-model mix (issue 37 item 6)


def test_real_mix_is_single_turn_lora_at_the_heldout_level():
    """TRL's GRPOTrainer is single-turn and trains on a prompt list drawn before training: the real mix
    is configs/real.yaml with every domain one turn and at a fixed level (the held-out one), LoRA kept."""
    from posttrain.configs import load_config
    from posttrain.pipeline.budget import domain_budgets
    from posttrain.tasks.pool import TaskPool

    mix = peer.MIXES["real"]
    cfg = load_config(ROOT / mix.config, list(mix.overrides))
    real = load_config(ROOT / "configs" / "real.yaml")
    assert set(cfg.tasks.domains) == set(real.tasks.domains) == {"ifeval", "pyfunc_revise"}
    assert cfg.trainer == real.trainer and cfg.rollout == real.rollout and cfg.model == real.model
    assert cfg.trainer.lora is not None and (cfg.trainer.lora.rank, cfg.trainer.lora.alpha) == (16, 32.0)
    pool = TaskPool(cfg.tasks, seed=0)
    assert all(b.turns == 1 for b in domain_budgets(pool.names, pool.specs, cfg.rollout.max_tokens).values())
    assert {n: s.difficulty for n, s in cfg.tasks.domains.items()} == {n: pool.eval_difficulty(n) for n in pool.names}
    assert real.tasks.domains["pyfunc_revise"].max_turns == 2  # the config itself is left multi-turn


def test_real_mix_trains_from_the_configs_real_model_and_sizes_the_trl_prompt_list(monkeypatch, tmp_path):
    import posttrain.model.pretrain as pretrain
    import posttrain.model.real as real

    monkeypatch.setattr(real, "resolve", lambda name: str(tmp_path / "cache" / str(name)))
    monkeypatch.setattr(pretrain, "ensure_base", lambda *a, **k: pytest.fail("the real mix needs no embedded base"))
    args = peer.parse_args(["--mixes", "real", "--budget-cpu-s", "900", "--work", str(tmp_path)])
    model = peer.base_model(args, peer.MIXES["real"])
    assert model == tmp_path / "cache" / "smollm2-135m-instruct"
    unit = peer.units_of(args)[0]
    cmd = peer.train_command("trl", unit, args, model, tmp_path / "trl")
    assert cmd[cmd.index("--min-step-s") + 1] == "10.0"  # 90 steps of prompts, not 6,000
    assert cmd[cmd.index("--micro-batch") + 1] == "8"  # 4 accumulated passes of 8 rows (32 in one: 16 GB)
    assert peer_trl.parse_args([*cmd[2:]]).micro_batch == 8
    demo = peer.Unit(peer.MIXES["demo"], 0, 1)
    assert "--micro-batch" not in peer.train_command("trl", demo, args, model, tmp_path / "trl")
    with pytest.raises(SystemExit):
        peer_trl.parse_args([*cmd[2:], "--micro-batch", "0"])
    assert "tasks.domains.pyfunc_revise.max_turns=1" in cmd
    pt = peer.train_command("posttrain", unit, args, model, tmp_path / "posttrain")
    assert "--min-step-s" not in pt and pt[-3:] == list(peer.MIXES["real"].overrides)


def test_trl_lora_is_posttrains_lora(micro_base):
    """The TRL side's peft LoraConfig puts the same adapters (names, shapes, scale) on the model as
    posttrain's trainer.lora does."""
    from peft import get_peft_model

    from posttrain.configs import load_config
    from posttrain.model.arch import load_model
    from posttrain.trainer.lora import apply_lora

    cfg = load_config(ROOT / "configs" / "real.yaml")
    assert peer_trl.lora_config(load_config(ROOT / "configs" / "default.yaml")) is None  # full fine-tuning there
    ours = apply_lora(load_model(micro_base)[0], cfg.trainer.lora)
    theirs = get_peft_model(load_model(micro_base)[0], peer_trl.lora_config(cfg))

    def adapters(m):
        return {n.replace("base_model.model.", ""): tuple(p.shape) for n, p in m.named_parameters() if p.requires_grad}

    assert adapters(theirs) == adapters(ours) and adapters(ours)

    def scales(m):
        return {s["default"] for s in (getattr(x, "scaling", None) for x in m.modules()) if isinstance(s, dict)}

    assert scales(theirs) == scales(ours) == {32.0 / 16}


def _adapter(base: str, folder: Path) -> dict:
    """A LoRA adapter on `base` with non-zero B (a trained one), saved into `folder` as peft saves it."""
    import torch

    from posttrain.configs.trainer import LoraConfig
    from posttrain.model.arch import load_model
    from posttrain.trainer.lora import apply_lora

    model = apply_lora(load_model(base)[0], LoraConfig(rank=2, alpha=4))
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    model.save_pretrained(folder)
    return {k: v.clone() for k, v in model.merge_and_unload().state_dict().items()}


def test_evaluable_merges_a_trl_adapter_and_leaves_the_rest(micro_base, tmp_path):
    import torch
    from safetensors.torch import load_file

    want = _adapter(micro_base, tmp_path / "trl" / "checkpoint-2")
    got = peer.evaluable(tmp_path / "trl" / "checkpoint-2", micro_base)
    assert got == tmp_path / "trl" / "merged" / "checkpoint-2" and (got / "config.json").is_file()
    merged = load_file(str(got / "model.safetensors"))
    assert set(merged) <= set(want) and merged
    assert all(torch.allclose(merged[k], want[k], atol=1e-5) for k in merged)  # W + (alpha/r) B A
    assert not torch.allclose(
        merged["model.layers.0.self_attn.q_proj.weight"],
        load_file(micro_base + "/model.safetensors")["model.layers.0.self_attn.q_proj.weight"],
    )
    assert peer.evaluable(tmp_path / "trl" / "checkpoint-2", micro_base) == got  # merged once
    assert peer.evaluable(micro_base, None) == Path(micro_base)  # a model folder as it is
    run_ckpt = tmp_path / "pt" / "run" / "checkpoints" / "step_2"
    _adapter(micro_base, run_ckpt)
    (tmp_path / "pt" / "run" / "config.yaml").write_text("{}")
    assert peer.evaluable(run_ckpt, micro_base) == run_ckpt  # posttrain eval merges its own run's checkpoints
    with pytest.raises(SystemExit, match="no base"):
        peer.evaluable(tmp_path / "trl" / "checkpoint-2", None)


def test_the_eval_worker_evaluates_a_trl_lora_adapter(micro_base, tmp_path):
    """`posttrain eval --model` refuses an adapter outside a run (it knows no base): the worker merges it."""
    _adapter(micro_base, tmp_path / "trl" / "final")
    evals = _run_eval_job(tmp_path, "{add: {}}", {"trl:final": str(tmp_path / "trl" / "final")}, base=micro_base)
    assert set(evals["trl:final"]["domains"]) == {"add"}
    assert (tmp_path / "trl" / "merged" / "final" / "config.json").is_file()


@pytest.mark.parametrize("keep", [False, True])
def test_evaluated_sides_drop_checkpoints_and_merges_unless_keep(tmp_path, keep):
    args = peer.parse_args(["--mixes", "real", "--work", str(tmp_path)] + (["--keep"] if keep else []))
    unit = peer.units_of(args)[0]
    folder = unit.folder(tmp_path)
    made = []
    for rel in ("trl/checkpoint-1", "trl/merged/checkpoint-1", "trl/merged/final", "trl/final"):
        (folder / rel).mkdir(parents=True)
        made.append(folder / rel)
    for rel in ("posttrain/run/checkpoints/step_1", "posttrain/run/checkpoints/step_2", "posttrain/run/merged/step_1"):
        (folder / rel).mkdir(parents=True)
        made.append(folder / rel)
    runs = {
        "trl": {"final": str(folder / "trl/final"), "checkpoints": {"1": str(folder / "trl/checkpoint-1")}},
        "posttrain": {
            "final": str(folder / "posttrain/run/checkpoints/step_2"),
            "checkpoints": {
                "1": str(folder / "posttrain/run/checkpoints/step_1"),
                "2": str(folder / "posttrain/run/checkpoints/step_2"),
            },
        },
    }
    for system, run in runs.items():
        (folder / system / f"{system}.json").write_text(json.dumps(run))
        labels = ["base", f"{system}:final", f"{system}:step1"]
        (folder / f"evals-{system}.json").write_text(json.dumps(dict.fromkeys(labels, {"mean": 0.5})))
        peer.evaluate_side(system, unit, args, tmp_path / "base")  # all evaluated: only the clean-up runs
    kept = {str(p.relative_to(folder)) for p in made if p.is_dir()}
    finals = {"trl/final", "posttrain/run/checkpoints/step_2"}
    assert kept == ({str(p.relative_to(folder)) for p in made} if keep else finals)


# ---------------------------------------------------------------- the TRL run (peer venv)


@pytest.mark.slow
@pytest.mark.skipif(not PEER_PYTHON.is_file(), reason="no peer venv (make bench-peer)")
def test_trl_side_trains_under_a_cpu_budget(micro_base, tmp_path):
    out = tmp_path / "trl"
    cmd = [
        str(PEER_PYTHON),
        str(ROOT / "bench" / "peer_trl.py"),
        "--config",
        str(ROOT / "configs" / "default.yaml"),
        "--model",
        micro_base,
        "--out",
        str(out),
        "--budget-cpu-s",
        "2",
        "--save-every",
        "1",
        "--min-step-s",
        "0.02",
        "rollout.prompts_per_step=4",
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=600)
    rec = json.loads((out / "trl.json").read_text())
    assert rec["stop_reason"].startswith("CPU budget") and rec["steps"] >= 1
    assert rec["cpu_s"] >= 2.0 and rec["trl_version"] == "1.16.0" and rec["torch_version"].startswith("2.13.0")
    assert len(rec["task_ids"]) == 4 * rec["steps"]
    assert set(rec["checkpoints"]) == {str(s) for s in range(1, rec["steps"] + 1)}
    assert (out / "final" / "model.safetensors").is_file()


def test_summary_leaves_out_units_without_results(tmp_path, capsys):
    units = peer.units_of(peer.parse_args(["--seeds", "0", "1", "--mixes", "demo"]))
    assert peer.summarize(tmp_path, units) == {}
    assert "demo/threads1 seed 1: no results" in capsys.readouterr().out


def test_profile_summary_categories_and_own_time():
    raw = "\n".join(
        [
            "<module> (peer.py:1);train (posttrain/loop.py:9);"
            "step (posttrain/trainer/trainer.py:40);backward (t.py:3) 60",
            "_bootstrap (threading.py:1);generate (posttrain/engine/hf.py:200);forward (m.py:5) 30",
            "<module> (peer.py:1);write_rollouts (posttrain/trace/__init__.py:80);execute (sqlite.py:2) 8",
            "<module> (peer.py:1);train (posttrain/loop.py:9);backward (t.py:3) 2",
            "not a stack line",
        ]
    )
    p = peer.profile_summary(raw, "posttrain", steps=5)
    # 100 samples at 100 Hz over 5 steps: 1 sample = 10 ms / 5 steps = 2 ms per step
    assert p["samples"] == 100
    assert {k: v["share"] for k, v in p["categories"].items()} == pytest.approx(
        {"train": 0.60, "generate": 0.30, "trace store": 0.08, "other": 0.02}
    )
    assert p["categories"]["train"]["ms_per_step"] == pytest.approx(120.0)
    assert p["top_own"][0] == ("backward (t.py:3)", pytest.approx(0.62))  # own samples: 60 + 2
    text = peer.profile_report({"posttrain, demo/threads1, seed 0": p})
    assert "| train | 60.0% | 120.0 |" in text and "| `backward (t.py:3)` | 62.0% |" in text


REAL_MODEL = Path.home() / ".cache" / "posttrain" / "models" / "smollm2-135m-instruct"
TOKEN_CHECK = """
import json, sys
sys.path.insert(0, "bench")
import peer, peer_trl
from datasets import Dataset
from posttrain.configs import load_config
from posttrain.engine.base import chat_ids
from posttrain.model.arch import load_tokenizer

mix = peer.MIXES["real"]
cfg = load_config(mix.config, list(mix.overrides))
tasks = peer_trl.draw_tasks(cfg, 3)
tok = load_tokenizer(cfg.model.path)
rows = [row["prompt"] for row in Dataset.from_dict(peer_trl.prompt_rows(tasks))]
ours = [list(chat_ids(tok, t.prompt)) for t in tasks]
domains = sorted({t.domain for t in tasks})
print(json.dumps({"trl": peer_trl.trl_prompt_ids(tok, rows), "posttrain": ours, "domains": domains}))
"""


@pytest.mark.skipif(not PEER_PYTHON.is_file(), reason="no peer venv (make bench-peer)")
@pytest.mark.skipif(not REAL_MODEL.is_dir(), reason="no cached smollm2-135m-instruct (posttrain models get)")
def test_trl_renders_the_real_mix_prompts_to_posttrains_token_ids():
    """TRL's own prompt tokenization (GRPOTrainer._tokenize_prompts) of the dataset peer_trl.py builds gives
    the token ids posttrain's engine generates from (engine.base.chat_ids, the model's chat template)."""
    out = subprocess.run(
        [str(PEER_PYTHON), "-c", TOKEN_CHECK], cwd=ROOT, capture_output=True, text=True, timeout=600, check=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["domains"] == ["ifeval", "pyfunc_revise"] and len(got["trl"]) == 24
    assert got["trl"] == got["posttrain"]


def test_summarize_finds_every_unit_its_work_folder_holds(tmp_path):
    for mix, t, s in [("real", 1, 2), ("real", 1, 0), ("real", 1, 1), ("demo", 2, 0)]:
        (tmp_path / mix / f"threads{t}" / f"seed{s}").mkdir(parents=True)
    (tmp_path / "real" / "threads1" / "seedX").mkdir()  # not a unit's folder
    (tmp_path / "real" / "heldout.json").write_text("[]")
    (tmp_path / "nope" / "threads1" / "seed0").mkdir(parents=True)  # not a mix
    found = peer.units_found(tmp_path, peer.parse_args(["--summarize", str(tmp_path)]))
    assert [(u.mix.name, u.threads, u.seed) for u in found] == [
        ("demo", 2, 0),
        ("real", 1, 0),
        ("real", 1, 1),
        ("real", 1, 2),
    ]
    # what was asked for narrows it; the defaults (seed 0, mixes demo and buggier) do not
    asked = peer.parse_args(["--summarize", str(tmp_path), "--mixes", "real", "--seeds", "2", "0"])
    assert [(u.mix.name, u.seed) for u in peer.units_found(tmp_path, asked)] == [("real", 0), ("real", 2)]


def test_summarize_without_a_finished_run_leaves_summary_json_alone(tmp_path):
    (tmp_path / "real" / "threads1" / "seed0").mkdir(parents=True)  # started, no results
    (tmp_path / "summary.json").write_text('{"kept": true}')
    with pytest.raises(SystemExit, match="no finished run"):
        peer.main(["--summarize", str(tmp_path)])
    assert (tmp_path / "summary.json").read_text() == '{"kept": true}'


@pytest.mark.slow
@pytest.mark.skipif(not PEER_PYTHON.is_file(), reason="no peer venv (make bench-peer)")
def test_posttrains_gradient_is_trls_on_the_same_rows(micro_base, tmp_path):
    """bench/peer_grad.py: on the same sampled rows and adapter weights (B non-zero, so every adapter
    matrix has a gradient), posttrain's step and TRL's compute_loss give the same gradient up to the
    uniform scale of their advantages' std (population against unbiased: sqrt(G / (G - 1))), one group
    without a signal left out by posttrain and counted in its normaliser as TRL counts it; TRL's rows in
    3 micro-batches, accumulated as its trainer accumulates them."""
    out = tmp_path / "grad.json"
    cmd = [
        str(PEER_PYTHON),
        str(ROOT / "bench" / "peer_grad.py"),
        "--model",
        micro_base,
        "--prompts",
        "3",
        "--max-tokens",
        "12",
        "--perturb-b",
        "0.05",
        "--rewards",
        "synthetic",
        "--threads",
        "1",
        "--trl-micro-batch",
        "4",
        "--json",
        str(out),
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, timeout=600, env={**os.environ, "PYTHONPATH": "src"})
    got = json.loads(out.read_text())
    assert got["groups_with_signal"] == 2 and got["rows"] == 8
    assert got["nonzero"] == got["matrices"] > 0
    assert got["cosine"] > 1 - 1e-6 and got["worst_matrix_cosine"] > 1 - 1e-4
    assert got["norm_ratio"] == pytest.approx(got["expected_ratio"], rel=1e-3)
    assert got["logprob_gap"] < 1e-4
