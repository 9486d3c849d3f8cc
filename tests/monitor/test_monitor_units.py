"""Monitor parts without a model: diversity measures, probes and audits, alarm detectors, actions."""

from __future__ import annotations

import dataclasses
import random

import pytest
from monitor_testlib import Letters

from posttrain.configs import load_config
from posttrain.domains.registry import get
from posttrain.errors import VerifierError
from posttrain.loop import apply_actions
from posttrain.metrics_log import MetricsLog, read_metrics
from posttrain.monitor.actions import ExcludeDomain, LowerWeight, Stop
from posttrain.monitor.alarms import EVAL_DETECTORS, STEP_DETECTORS, History, KLAcceleration, RewardHacking
from posttrain.monitor.diversity import distinct_answers, distinct_n, levenshtein, mean_pairwise_edit
from posttrain.monitor.monitor import Monitor, RunContext
from posttrain.monitor.probes import probe_domain
from posttrain.monitor.signals import DomainSignals
from posttrain.tasks.pool import TaskPool
from posttrain.trace import TraceStore
from posttrain.types import Episode


def _dp(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        prev, row[0] = row[:], i
        for j in range(1, len(b) + 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
    return row[-1]


def test_levenshtein_by_hand_and_against_dp():
    # kitten -> sitting: k->s, e->i, +g = 3; flaw -> lawn: -f, +n = 2
    pairs = [("kitten", "sitting"), ("flaw", "lawn"), ("", "abc"), ("abc", ""), ("abc", "abc"), ("", "")]
    assert levenshtein([a for a, _ in pairs], [b for _, b in pairs]).tolist() == [3, 2, 3, 3, 0, 0]
    rng = random.Random(0)
    a = ["".join(rng.choices("ab\0é", k=rng.randint(0, 8))) for _ in range(500)]
    b = ["".join(rng.choices("ab\0é", k=rng.randint(0, 8))) for _ in range(500)]
    assert levenshtein(a, b).tolist() == [_dp(x, y) for x, y in zip(a, b)]


def test_group_diversity_measures():
    # pairs (abc,abd)=1/3, (abc,xbc)=1/3, (abd,xbc)=2/3: mean 4/9
    assert mean_pairwise_edit([["abc", "abd", "xbc"], ["ab", "ab"], ["ab", "cd"]]) == pytest.approx([4 / 9, 0.0, 1.0])
    assert distinct_answers(["<answer>1</answer>", "1", "2", "x"]) == 0.75
    assert distinct_answers(["7"] * 8) == 1 / 8
    assert distinct_n(["aaa"], 2) == 0.5 and distinct_n(["ab", "ab"], 2) == 0.5 and distinct_n(["a"], 2) == 0.0


@pytest.mark.parametrize("name", ["add", "sub", "mul", "reverse", "sort"])
def test_builtin_verifiers_reject_their_cheats_and_audits_agree(name):
    domain = get(name)
    result = probe_domain(domain, 1, 4)
    assert result is not None and result.cheats >= 4 * 5 and result.ok, result.message()
    for i in range(4):
        task = domain.sample(i, "train", 1)
        assert domain.has_audit and domain.audit(task, domain.gold(task)) is True
        assert domain.audit(task, domain.wrong(task)) is False
        assert not any(domain.audit(task, c) for c in domain.cheats(task))


def test_builtin_audit_recomputes_from_the_question_not_the_reference():
    import dataclasses as dc

    domain = get("add")
    task = domain.sample(0, "train", 1)
    lying = dc.replace(task, reference=str(int(task.reference) + 5))  # a task whose stored reference is wrong
    assert domain.score(lying, Episode(lying.reference)).passed  # the reward trusts the reference ...
    assert domain.audit(lying, lying.reference) is False  # ... the audit does not
    bad = dc.replace(task, prompt=(dc.replace(task.prompt[-1], content="what is two plus two?"),))
    with pytest.raises(VerifierError, match="cannot parse question"):
        domain.audit(bad, "4")
    assert not get("code").has_audit and get("code").audit(task, "") is True  # the declared default: no stricter check


def test_probe_catches_the_digit_hack():
    result = probe_domain(Letters(), 1, 3)
    assert not result.ok and len(result.accepted) == 3 * 3
    assert "accepts 9 of 9 cheat outputs" in result.message()
    assert Letters().score(Letters().sample(0, "train", 1), Episode("zz9")).passed  # the hack itself


def _sig(**kw) -> DomainSignals:
    base = dict(
        rollouts=8,
        scored=8,
        reward_mean=0.3,
        reward_std=0.4,
        pass_rate=0.3,
        entropy=2.0,
        distinct_answers=0.8,
        distinct_n=0.6,
        edit_distance=0.7,
        length_mean=4.0,
        truncated_share=0.0,
        adv_mean=0.0,
        adv_std=1.0,
        ratio_mean=1.0,
        clip_share=0.0,
        groups=1,
        filtered_share=0.0,
        infra_error_rate=0.0,
    )
    return DomainSignals(**{**base, **kw})


def _history(values: list[dict], domain: str = "add") -> History:
    h = History()
    h.signals[domain] = [(i + 1, _sig(**v)) for i, v in enumerate(values)]
    return h


def _kinds(h: History, detectors=STEP_DETECTORS) -> set[tuple[str, str | None]]:
    cfg = load_config(None, ["monitor.alarms.baseline_steps=3", "monitor.alarms.window=3"]).monitor.alarms
    return {(hit.kind, hit.domain) for d in detectors for hit in d.check(h, cfg)}


def test_collapse_needs_baseline_and_window_and_an_unsolved_domain():
    falling = [{"entropy": 2.0}] * 3 + [{"entropy": 0.1}] * 3
    assert ("entropy_collapse", "add") in _kinds(_history(falling))
    assert _kinds(_history(falling[:5])) == set()  # baseline 3 + window 3 not reached
    solved = [{**v, "reward_mean": 0.95} for v in falling]
    assert ("entropy_collapse", "add") not in _kinds(_history(solved))
    same = [{"distinct_answers": 0.8}] * 3 + [{"distinct_answers": 0.125}] * 3
    assert _kinds(_history(same)) == {("diversity_collapse", "add")}


def test_length_explosion_and_audit_failure():
    longer = [{"length_mean": 4.0}] * 3 + [{"length_mean": 9.0}] * 3
    assert _kinds(_history(longer)) == {("length_explosion", "add")}
    truncating = [{"truncated_share": 0.0}] * 3 + [{"truncated_share": 0.7}] * 3
    assert _kinds(_history(truncating)) == {("length_explosion", "add")}
    h = History(audits={"add": [(1, 8, 0), (2, 8, 1), (3, 8, 5)]})  # 6 of 24 = 25% > 20%
    assert _kinds(h) == {("audit_failure", "add")}
    h.audits["add"][-1] = (3, 8, 3)  # 4 of 24 = 17%
    assert _kinds(h) == set()


def test_kl_acceleration():
    cfg = load_config(None, ["monitor.alarms.kl_acceleration.window=3"]).monitor.alarms
    h = History(kl={"add": [(i, v) for i, v in enumerate([0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.1, 0.3, 0.6])]})
    # windows of 3: means 0.01, 0.04, 0.333: growth 0.293 > 3 x max(0.03, 1.0 x 0.04)
    assert [hit.kind for hit in KLAcceleration().check(h, cfg)] == ["kl_acceleration"]
    h.kl["add"] = [(i, 0.01 * i) for i in range(9)]  # steady growth
    assert KLAcceleration().check(h, cfg) == []
    # noise around a high level: means 0.8, 0.6, 0.9: growth 0.3 < 3 x max(-0.2, 1.0 x 0.6)
    h.kl["add"] = [(i, v) for i, v in enumerate([0.7, 0.9, 0.8, 0.5, 0.7, 0.6, 1.0, 0.8, 0.9])]
    assert KLAcceleration().check(h, cfg) == []


def test_reward_hacking_and_domain_regression_at_evaluations():
    h = _history([{"reward_mean": 0.2}] * 3 + [{"reward_mean": 0.6}] * 3)
    h.evals = [(0, {"add": 0.2}), (6, {"add": 0.21})]
    assert _kinds(h, EVAL_DETECTORS) == {("reward_hacking", "add")}
    h.evals[-1] = (6, {"add": 0.5})  # held-out followed the train reward: no alarm
    assert (
        RewardHacking().check(
            h, load_config(None, ["monitor.alarms.baseline_steps=3", "monitor.alarms.window=3"]).monitor.alarms
        )
        == []
    )
    g = History(
        evals=[
            (0, {"add": 0.5, "sub": 0.2, "mul": 0.2}),
            (10, {"add": 0.6, "sub": 0.3, "mul": 0.3}),
            (20, {"add": 0.4, "sub": 0.5, "mul": 0.5}),
        ]
    )
    assert _kinds(g, EVAL_DETECTORS) == {("domain_regression", "add")}
    # add's drop 0.6 -> 0.4 on 50 items each is within noise: 1.96 * sqrt(.24/50 + .24/50) = 0.192 < 0.2,
    # so still an alarm; on 30 items each the margin is 0.248 > 0.2 and nothing fires
    g.eval_counts = [{"add": 50, "sub": 50, "mul": 50}] * 3
    assert _kinds(g, EVAL_DETECTORS) == {("domain_regression", "add")}
    g.eval_counts = [{"add": 30, "sub": 30, "mul": 30}] * 3
    assert _kinds(g, EVAL_DETECTORS) == set()


@pytest.fixture()
def monitor_parts(tmp_path):
    cfg = load_config(
        None,
        [
            "tasks.domains={add: {difficulty: 1}, reverse: {difficulty: 1}}",
            "monitor.alarms.baseline_steps=3",
            "monitor.alarms.window=3",
            "monitor.alarms.entropy_collapse.action=lower_weight",
        ],
    )
    pool = TaskPool(cfg.tasks, seed=0)
    trace, metrics = TraceStore(tmp_path / "trace.db"), MetricsLog(tmp_path / "metrics.jsonl")
    return cfg, pool, trace, metrics, tmp_path


def _monitor(cfg, run, trace, metrics, pool, state=None, start_step=0):
    """A started monitor and the loop's answer to its start actions (the stop reason, if any)."""
    mon = Monitor(cfg.monitor, RunContext.of(cfg, run), trace, metrics, pool, log=lambda *_: None)
    return mon, apply_actions(mon.start(start_step, state), pool)


def _check(mon, pool, step, detectors=STEP_DETECTORS):
    """One alarm check as the loop sees it: the monitor returns actions, the loop applies them."""
    mon._check(step, detectors)
    actions = mon._take()
    return actions, apply_actions(actions, pool)


def test_actions_fire_once_rearm_and_survive_resume(monitor_parts):
    cfg, pool, trace, metrics, run = monitor_parts
    mon, _ = _monitor(cfg, run, trace, metrics, pool)
    falling = [_sig(entropy=2.0)] * 3 + [_sig(entropy=0.1)] * 3
    mon.history.signals["add"] = [(i + 1, s) for i, s in enumerate(falling)]
    mon._check(6, STEP_DETECTORS)
    assert pool.target_shares()["add"] == pytest.approx(1 / 2)  # the monitor only observes ...
    assert apply_actions(mon._take(), pool) == ""  # ... the loop acts
    assert _check(mon, pool, 7) == ([], "")
    alarms = read_metrics(run / "metrics.jsonl", "alarm")
    assert [(a["alarm"], a["step"]) for a in alarms] == [("entropy_collapse", 6)]  # once, not every step
    assert alarms[0]["done"] == "weight of add x0.5 (now x0.5)"
    assert pool.target_shares()["add"] == pytest.approx(1 / 3)  # weight 1 -> 0.5 against reverse's 1
    assert [e["domain"] for e in trace.events("alarm")] == ["add"]
    # the condition clears, then holds again: it fires again and lowers the weight again
    mon.history.signals["add"] += [(7 + i, _sig(entropy=2.0)) for i in range(3)]
    assert _check(mon, pool, 10) == ([], "")
    mon.history.signals["add"] += [(10 + i, _sig(entropy=0.01)) for i in range(3)]
    assert _check(mon, pool, 13) == ([LowerWeight("add", 0.5)], "")
    assert len(read_metrics(run / "metrics.jsonl", "alarm")) == 2
    assert pool.target_shares()["add"] == pytest.approx(0.25 / 1.25)
    # a fresh pool given the actions a restored monitor returns draws with the same weights
    fresh = TaskPool(cfg.tasks, seed=0)
    _monitor(cfg, run, trace, metrics, fresh, state=mon.state_dict())
    assert fresh.target_shares() == pool.target_shares()
    # a checkpoint written before the actions were typed (multipliers only) restores the same weights
    older = TaskPool(cfg.tasks, seed=0)
    _monitor(cfg, run, trace, metrics, older, state={"weights": {"add": 0.25}, "excluded": [], "active": []})
    assert older.target_shares() == pool.target_shares()


def test_stop_action_and_probe_refusal(monitor_parts, monkeypatch):
    cfg, pool, trace, metrics, run = monitor_parts
    cfg = cfg.model_copy(
        update={
            "monitor": load_config(
                None,
                [
                    "monitor.alarms.diversity_collapse.action=stop",
                    "monitor.alarms.baseline_steps=3",
                    "monitor.alarms.window=3",
                ],
            ).monitor
        }
    )
    mon, _ = _monitor(cfg, run, trace, metrics, pool)
    mon.history.signals["reverse"] = [(i + 1, _sig(distinct_answers=v)) for i, v in enumerate([0.9] * 3 + [0.1] * 3)]
    (action,), stop = _check(mon, pool, 6)
    assert isinstance(action, Stop) and stop == action.reason
    assert stop.startswith("diversity (distinct answers per group) collapse in reverse")
    from posttrain.domains import registry

    monkeypatch.setitem(registry._REGISTRY, "test_letters", Letters())
    cfg2 = load_config(None, ["tasks.domains={test_letters: {difficulty: 1}, add: {difficulty: 1}}"])
    pool2 = TaskPool(cfg2.tasks, seed=0)
    mon2 = Monitor(cfg2.monitor, RunContext.of(cfg2, run), trace, metrics, pool2, log=lambda *_: None)
    (exclude,) = mon2.start()
    assert isinstance(exclude, ExcludeDomain) and exclude.domain == "test_letters"
    assert pool2.names == ("add", "test_letters")  # the monitor never writes to the pool ...
    assert apply_actions([exclude], pool2) == ""  # ... the loop applies the action through its API
    assert pool2.names == ("add",) and pool2.excluded == ("test_letters",)
    assert {t.domain for t in pool2.draw(20)} == {"add"}
    assert mon2.state_dict()["excluded"] == ["test_letters"]
    stop = cfg2.model_copy(update={"monitor": load_config(None, ["monitor.probes.action=stop"]).monitor})
    with pytest.raises(VerifierError, match="refusing to train"):
        _monitor(stop, run, trace, metrics, TaskPool(cfg2.tasks, seed=0))


def test_loop_applies_actions_through_the_pool_api(monitor_parts):
    cfg, pool, *_ = monitor_parts
    assert apply_actions([], pool) == ""
    stop = apply_actions([LowerWeight("add", 0.5), Stop("first"), ExcludeDomain("add", "r"), Stop("second")], pool)
    assert stop == "first" and pool.weight("add") == 0.5 and pool.names == ("reverse",)
    assert apply_actions([Stop("later")], pool, stop) == "first"  # the first reason wins
    from posttrain.errors import TaskError

    with pytest.raises(TaskError, match="not in this pool"):
        apply_actions([ExcludeDomain("mul", "r")], pool)


def test_signals_reload_from_metrics_on_resume(monitor_parts):
    cfg, pool, trace, metrics, run = monitor_parts
    s = _sig(entropy=1.5)
    for step in (1, 2, 3):
        metrics.write("monitor", step, domains={"add": dataclasses.asdict(s)}, kl={"add": 0.01 * step}, audit={})
    metrics.write("heldout", 0, domains={"add": 0.1}, strict={}, trusted={"add": 0.1})
    mon, _ = _monitor(cfg, run, trace, metrics, pool, start_step=2)
    assert [st for st, _ in mon.history.signals["add"]] == [1, 2]
    assert mon.history.kl["add"] == [(1, 0.01), (2, 0.02)] and mon.history.evals == [(0, {"add": 0.1})]
