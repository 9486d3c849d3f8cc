"""Evaluation in the mode of training: multi-turn domains are played as episodes by the episode
driver, and pass@turn-k (passed using at most k turns) is reported; single-turn domains unchanged."""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "pipeline"))
from pipeline_testlib import ScriptedEngine  # noqa: E402

from posttrain.domains.lookup import _miscopy  # noqa: E402
from posttrain.evaluate.core import DomainResult, EvalOptions, EvalTable, _result, evaluate_sets  # noqa: E402
from posttrain.evaluate.heldout import domain_set  # noqa: E402
from posttrain.evaluate.tables import format_turns  # noqa: E402

LOOKUP = domain_set("lookup", 1, 8, "core")
REVERSE = domain_set("reverse", 1, 4, "core")
KEYS = [t.reference["key"] for t in LOOKUP.tasks()]
# one behaviour per held-out item (by its key), and what each gives: (passed, turns used)
BEHAVIOUR = dict(zip(KEYS, ["copy", "copy", "copy", "retry", "guess", "miscopy", "copy", "copy"]))
EXPECTED = {"copy": (True, 2), "retry": (True, 3), "guess": (False, 1), "miscopy": (False, 2)}


def policy(context: str, j: int) -> str:
    """A scripted agent that reads its context (prompt and observations) like the model would."""
    if m := re.search(r"rev (\w+)=", context):
        return m.group(1)[::-1]
    key = re.search(r"value_of:(\w+)\?", context).group(1)
    kind = BEHAVIOUR[key]
    seen = re.findall(rf"{key}=(\d+)", context)
    if kind == "guess":
        return "123"
    if not seen:
        return f"look:{key}x" if kind == "retry" and "no_key" not in context else f"look:{key}"
    return _miscopy(seen[-1]) if kind == "miscopy" else seen[-1]


def test_pass_at_turn_from_items_by_hand():
    # items (verdict, turns): pass@2, pass@3, fail@3, pass@1, infra@2 -> 4 scored;
    # by turn 1: 1/4, by turn 2: 2/4, by turn 3: 3/4
    items = [("a", True, True), ("b", True, True), ("c", False, False), ("d", True, True), ("e", None, None)]
    r = _result("lookup", 1, "core", 5, "v", items, [], turns=[2, 3, 3, 1, 2], turn_budget=3)
    assert {k: v[0] for k, v in r.pass_at_turn.items()} == {1: 0.25, 2: 0.5, 3: 0.75}
    assert r.accuracy == 0.75 and r.pass_at_turn[3][0] == r.accuracy
    low, high = r.pass_at_turn[1][1:]
    assert low < 0.25 < high
    head = r.head(2)  # the fixed subset keeps each item's turns: (pass@2, pass@3)
    assert {k: v[0] for k, v in head.pass_at_turn.items()} == {1: 0.0, 2: 0.5, 3: 1.0}
    back = type(r).from_json(r.to_json())
    assert back.pass_at_turn == r.pass_at_turn and back.turns == r.turns


def test_turn_gain_is_the_share_converted_at_each_turn_with_its_interval():
    # the same items: converted at turn 2: "a" (1 of 4), at turn 3: "b" (1 of 4; "c" failed at 3)
    items = [("a", True, True), ("b", True, True), ("c", False, False), ("d", True, True), ("e", None, None)]
    r = _result("lookup", 1, "core", 5, "v", items, [], turns=[2, 3, 3, 1, 2], turn_budget=3)
    gain = r.turn_gain
    assert set(gain) == {2, 3} and gain[2][0] == 0.25 and gain[2][3] == 1 and gain[3][3] == 1
    for k in (2, 3):  # each is pass@turn-k minus pass@turn-(k-1), its interval strictly around it
        assert gain[k][0] == r.pass_at_turn[k][0] - r.pass_at_turn[k - 1][0]
        assert 0 < gain[k][1] < gain[k][0] < gain[k][2]
    # no conversion: the difference is 0 and its interval starts at 0 (not above it)
    flat = _result("lookup", 1, "core", 2, "v", items[2:4], [], turns=[3, 1], turn_budget=3)
    assert flat.turn_gain[2][:2] == (0.0, 0.0) and flat.turn_gain[2][3] == 0
    assert r.to_json()["turn_gain"]["2"][0] == 0.25
    text = format_turns(EvalTable(0, {"lookup": r}))
    assert "converted:  turn-2 +0.250" in text and "(1 of 4)" in text


def test_multi_turn_domain_is_evaluated_as_episodes_with_pass_at_turn():
    engine = ScriptedEngine(policy)
    res = evaluate_sets(engine, {"lookup": LOOKUP, "reverse": REVERSE}, EvalOptions())
    lookup, reverse = res["lookup"], res["reverse"]
    want = [EXPECTED[BEHAVIOUR[k]] for k in KEYS]
    assert [ok for _, ok, _ in lookup.items] == [ok for ok, _ in want]
    assert list(lookup.turns) == [n for _, n in want]
    # hand-derived: 5 of 8 pass within 2 turns (the copies), 6 within 3 (and the retry)
    assert lookup.turn_budget == 3
    assert {k: v[0] for k, v in lookup.pass_at_turn.items()} == {1: 0.0, 2: 5 / 8, 3: 6 / 8}
    assert lookup.accuracy == 6 / 8
    assert reverse.accuracy == 1.0 and reverse.turn_budget == 0 and not reverse.pass_at_turn
    assert "pass_at_turn" not in reverse.to_json() and lookup.to_json()["pass_at_turn"]["2"][0] == 5 / 8


def test_turn_budget_override_is_the_training_one():
    engine = ScriptedEngine(policy)
    res = evaluate_sets(engine, {"lookup": LOOKUP}, EvalOptions(turns={"lookup": 2}))["lookup"]
    # with 2 turns the retry (wrong key, then the right one) never gets to answer
    assert res.turn_budget == 2 and res.accuracy == 5 / 8
    assert max(res.turns) == 2


def test_format_turns_shows_both_sides_and_skips_single_turn_tables():
    engine = ScriptedEngine(policy)
    table = EvalTable(0, evaluate_sets(engine, {"lookup": LOOKUP, "reverse": REVERSE}, EvalOptions()))
    text = format_turns(table, table)
    assert "lookup" in text and "turn-2 0.625" in text and "turn-3 0.750" in text and "reverse" not in text
    single = EvalTable(0, evaluate_sets(engine, {"reverse": REVERSE}, EvalOptions()))
    assert format_turns(single) == ""


@pytest.mark.parametrize("samples", [4])
def test_sampled_metrics_of_a_multi_turn_domain_come_from_episodes(samples):
    engine = ScriptedEngine(policy)
    opts = EvalOptions(samples=samples, ks=(1, 4))
    res = evaluate_sets(engine, {"lookup": LOOKUP}, opts, sample_kinds=("core",))["lookup"]
    assert res.sampling["pass@1"][0] == pytest.approx(6 / 8)  # the scripted agent is deterministic
    # the loop's figures at the sampling temperature, per item then averaged: 5 copies pass at turn 2,
    # the retry at turn 3, so by turn 1 none, by turn 2 5/8, by turn 3 6/8; converted 5/8 at 2, 1/8 at 3
    s = res.sampling
    assert [s[f"pass1-by-turn@{t}"][0] for t in (1, 2, 3)] == pytest.approx([0.0, 5 / 8, 6 / 8])
    assert [s[f"converted-at-turn@{t}"][0] for t in (2, 3)] == pytest.approx([5 / 8, 1 / 8])
    assert "converted-at-turn@1" not in s and s["pass1-by-turn@3"][0] == pytest.approx(s["pass@1"][0])


def test_repeated_at_turn_counts_the_samples_that_hand_back_their_last_answer():
    # on the first 4 items the agent looks the key up again at every turn (the second time with other
    # whitespace: still the same answer), on the other 4 it copies the value at turn 2: half the items repeat
    # at turns 2 and 3 (every sample), the other half never; a turn a sample never reached does not count
    def stuck(context: str, j: int) -> str:
        key = re.search(r"value_of:(\w+)\?", context).group(1)
        seen = re.findall(rf"{key}=(\d+)", context)
        if key in KEYS[:4]:
            return f"look:{key}" + "  " * len(seen)
        return seen[-1] if seen else f"look:{key}"

    res = evaluate_sets(ScriptedEngine(stuck), {"lookup": LOOKUP}, EvalOptions(samples=4, ks=(1,)), ("core",))
    s, per = res["lookup"].sampling, res["lookup"].sampling_items
    assert [s[f"repeated-at-turn@{t}"][0] for t in (2, 3)] == pytest.approx([0.5, 0.5])
    assert [per[t.id]["repeated-at-turn@2"] for t in LOOKUP.tasks()] == [1.0] * 4 + [0.0] * 4
    assert [per[t.id]["converted-at-turn@2"] for t in LOOKUP.tasks()] == [0.0] * 4 + [1.0] * 4
    assert [per[t.id]["repeated-at-turn@3"] for t in LOOKUP.tasks()] == [1.0] * 4 + [0.0] * 4
    assert "repeated-at-turn@1" not in s
    # the scripted agent of the tests above never repeats itself
    plain = evaluate_sets(ScriptedEngine(policy), {"lookup": LOOKUP}, EvalOptions(samples=2, ks=(1,)), ("core",))
    assert plain["lookup"].sampling["repeated-at-turn@2"][0] == 0.0


def test_sampled_turn_figures_average_each_items_samples_and_interval_over_items():
    # samples 0 and 1 copy (pass at turn 2), samples 2 and 3 guess (fail at turn 1): every item but the
    # first converts half its samples at turn 2, the first all 4: the mean is 0.5 + 0.5/8, and the interval
    # is of the 8 item means (one 1.0, seven 0.5), not of 32 independent samples
    def split(context: str, j: int) -> str:
        key = re.search(r"value_of:(\w+)\?", context).group(1)
        if j >= 2 and key != KEYS[0]:
            return "123"
        seen = re.findall(rf"{key}=(\d+)", context)
        return seen[-1] if seen else f"look:{key}"

    res = evaluate_sets(ScriptedEngine(split), {"lookup": LOOKUP}, EvalOptions(samples=4, ks=(1,)), ("core",))
    gain = res["lookup"].sampling["converted-at-turn@2"]
    assert gain[0] == pytest.approx(0.5 + 0.5 / 8)
    half = 1.959964 * statistics.stdev([1.0] + [0.5] * 7) / 8**0.5  # 0.122; over 32 samples it would be 0.17
    assert gain[1:] == pytest.approx((gain[0] - half, gain[0] + half), abs=1e-4)
    assert res["lookup"].sampling["pass1-by-turn@1"][:3] == (0.0, 0.0, 0.0)
    # the per-item values behind the figures, by item id, and through eval.json and back
    per = res["lookup"].sampling_items
    assert [per[t.id]["converted-at-turn@2"] for t in LOOKUP.tasks()] == [1.0] + [0.5] * 7
    assert statistics.mean(v["converted-at-turn@2"] for v in per.values()) == pytest.approx(gain[0])
    back = DomainResult.from_json(json.loads(json.dumps(res["lookup"].to_json())))
    assert back.sampling_items == per and back.sampling == res["lookup"].sampling
    # a single-turn domain gets no turn figures
    reverse = evaluate_sets(ScriptedEngine(policy), {"reverse": REVERSE}, EvalOptions(samples=2, ks=(1,)), ("core",))
    assert not any("turn" in k for k in reverse["reverse"].sampling)


def test_an_environment_that_keeps_failing_is_an_infra_error_not_a_zero(monkeypatch):
    from posttrain.domains.lookup import LookupEnv
    from posttrain.errors import SandboxError

    def broken(self, action):
        raise SandboxError("the tool's sandbox died")

    monkeypatch.setattr(LookupEnv, "step", broken)
    res = evaluate_sets(ScriptedEngine(policy), {"lookup": LOOKUP}, EvalOptions())["lookup"]
    assert res.accuracy is None and res.infra_errors == 8 and res.pass_at_turn == {}


def test_report_and_compare_show_pass_at_turn():
    from posttrain.evaluate.compare import compare_tables
    from posttrain.report.evalhtml import turns_table

    engine = ScriptedEngine(policy)
    table = EvalTable(0, evaluate_sets(engine, {"lookup": LOOKUP, "reverse": REVERSE}, EvalOptions()))
    data = compare_tables(table, table)
    page = turns_table(data, labels=("A", "B"))
    assert page.count("<tr>") == 3 and "pass@turn-3" in page and "0.625" in page and "reverse" not in page
    # the copies converted at turn 2 (5 of 8), the retry at turn 3 (1 of 8)
    assert "turn-2 +0.625" in page and "5 of 8" in page and "turn-3 +0.125" in page
    single = EvalTable(0, evaluate_sets(engine, {"reverse": REVERSE}, EvalOptions()))
    assert turns_table(compare_tables(single, single)) == ""


def test_stop_rates_by_hand_split_by_feasibility_and_survive_json_and_head():
    # (stopped, infeasible): two infeasible items (one stopped), three feasible (one stopped), an
    # infra error (no parts): stop rate 1/2 where the task cannot be met, 1/3 where it can
    items = [("a", True, True), ("b", False, False), ("c", True, True), ("d", False, False), ("e", True, True)]
    items.append(("f", None, None))
    stops = [(1, 1), (0, 1), (0, 0), (1, 0), (0, 0), None]
    r = _result("geo_fix", 1, "core", 6, "v", items, [], turns=[2, 3, 1, 2, 2, 1], turn_budget=3, stops=stops)
    rates = r.stop_rates
    assert rates["infeasible"][0] == 0.5 and rates["infeasible"][3] == 2
    assert abs(rates["feasible"][0] - 1 / 3) < 1e-12 and rates["feasible"][3] == 3
    assert rates["feasible"][1] < 1 / 3 < rates["feasible"][2]
    back = type(r).from_json(r.to_json())
    assert back.stop_rates == rates and r.to_json()["stop_rate"]["infeasible"][0] == 0.5
    assert r.head(2).stop_rates["infeasible"][0] == 0.5 and r.head(2).stop_rates["feasible"][3] == 0
    assert "stop rate:" in format_turns(EvalTable(0, {"geo_fix": r}))
    # a domain whose scores carry no stop parts has no stop rates, in JSON or text
    plain = _result("lookup", 1, "core", 2, "v", items[:2], [], turns=[2, 2], turn_budget=3, stops=[None, None])
    assert plain.stop_rates == {} and "stop_rate" not in plain.to_json()
    assert "stop rate:" not in format_turns(EvalTable(0, {"lookup": plain}))
