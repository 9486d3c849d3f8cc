"""The tool world: one call protocol ({"name", "arguments"}, or a list of calls),
results as observations, `finish` ends the episode; the verifier replays the
actions and scores outcome x (0.8 + 0.1 process + 0.1 efficiency). The gold
trajectory and the gold single action both score 1; the prompt asks for exactly
what the environment parses."""

from __future__ import annotations

import json

import pytest

from posttrain.domains.registry import all_domains, get
from posttrain.domains.toolworld import CALL_FORMAT, ToolEnv, parse_calls
from posttrain.envs.base import StepResult
from posttrain.types import Episode, Turn

TOOL_DOMAINS = sorted(n for n in all_domains() if n.startswith("tool_"))


def play(domain, task, actions):
    """Drive a fresh environment through `actions` until done, as the episode driver does."""
    env = domain.environment()()
    assert env.reset(task) == ""
    turns = []
    for action in actions:
        got = env.step(action)
        assert isinstance(got, StepResult)
        turns.append(Turn(action, got.observation, parts=got.parts))
        if got.done:
            break
    env.close()
    return Episode(turns[-1].action, tuple(turns)), got.done


def _task(level=2):
    d = get("tool_cancel_refund")
    return d, d.sample(0, "train", level)


@pytest.mark.parametrize("name", TOOL_DOMAINS)
def test_gold_trajectory_and_gold_action_score_one(name):
    d = get(name)
    for level in (1, 3):
        task = d.sample(2, "train", level)
        turns = d.gold_turns(task)
        assert len(turns) <= d.budget.turns and json.loads(turns[-1]) == {"name": "finish", "arguments": {}}
        episode, done = play(d, task, turns)
        assert done and len(episode.turns) == len(turns)
        assert all(t.parts == {"process": 1.0} and not t.observation.startswith("error") for t in episode.turns)
        assert d.score(task, episode).value == 1.0
        single, done = play(d, task, [d.gold(task)])  # the whole list in one turn: one step, done
        assert done and d.score(task, single).value == 1.0 and d.score(task, Episode(d.gold(task))).value == 1.0
        assert d.score(task, Episode(d.wrong(task))).value < 1.0


def test_prompt_asks_for_the_protocol_the_environment_parses():
    d, task = _task()
    prompt = task.prompt[0].content
    assert CALL_FORMAT in prompt and "finish" in prompt and "one JSON object per line" not in prompt
    first = d.gold_turns(task)[0]
    assert parse_calls(first) == [json.loads(first)]
    assert parse_calls(f"<answer>{first}</answer>") == parse_calls(f"```json\n{first}\n```") == [json.loads(first)]


def test_results_come_back_as_observations():
    d, task = _task()
    env = ToolEnv()
    env.reset(task)
    who = json.loads(d.gold_turns(task)[0])["arguments"]["customer"]
    got = env.step(json.dumps({"name": "find_orders", "arguments": {"customer": who}}))
    orders = json.loads(got.observation)
    assert not got.done and orders and all(o["customer"] == who for o in orders)
    got = env.step(json.dumps({"name": "cancel_order", "arguments": {"order_id": "O999999"}}))
    assert got.observation == "failed: no order 'O999999'" and got.parts == {"process": 1.0}  # well formed, refused
    got = env.step(json.dumps([{"name": "finish", "arguments": {}}, {"name": "list_inventory", "arguments": {}}]))
    assert got.done and got.observation == "finished"  # calls after finish are not run
    assert env.step("{}").observation == "error: the episode is over"


def test_protocol_violations_are_observed_and_scored():
    d, task = _task()
    env = ToolEnv()
    env.reset(task)
    got = env.step("not json")
    assert got.observation.startswith("error: not JSON") and not got.done and got.parts == {"process": 0.0}
    got = env.step(json.dumps({"tool": "transfer", "args": {}}))  # the old format is a violation
    assert got.observation.startswith("error: a tool call is")
    got = env.step(json.dumps({"name": "transfer", "arguments": {"from_id": "A101"}}))
    assert "takes exactly" in got.observation
    got = env.step(json.dumps([{"name": "nope", "arguments": {}}, {"name": "list_inventory", "arguments": {}}]))
    assert got.parts == {"process": 0.5} and got.observation.splitlines()[0] == "error: unknown tool 'nope'"
    gold = d.gold_turns(task)
    episode, _ = play(d, task, ['{"name": "nope", "arguments": {}}', *gold])
    score = d.score(task, episode)
    assert score.parts["outcome"] == 1.0 and score.parts["process"] < 1.0 and 0.8 <= score.value < 1.0
    assert not score.passed


def test_collateral_change_fails_the_goal():
    d, task = _task()
    accounts = task.reference["world"]["accounts"]
    a, b = sorted(accounts, key=lambda k: -accounts[k]["balance"])[:2]
    extra = json.dumps({"name": "transfer", "arguments": {"from_id": a, "to_id": b, "amount": 0.01}})
    gold = d.gold_turns(task)
    episode, _ = play(d, task, gold[:-1] + [extra, gold[-1]])
    score = d.score(task, episode)
    assert score.parts["outcome"] == 0.0 and score.value == 0.0 and score.parts["efficiency"] == 0.0


def test_call_budget_lowers_efficiency_and_the_limit_ends_the_episode():
    d, task = _task()
    gold = d.gold_turns(task)
    budget = task.reference["budget"]
    episode, _ = play(d, task, [gold[0]] * budget + gold)
    score = d.score(task, episode)
    assert score.parts["outcome"] == 1.0 and 0.0 <= score.parts["efficiency"] < 1.0 and not score.passed
    episode, done = play(d, task, [gold[0]] * (10 * budget))
    assert done and len(episode.turns) == 3 * budget and "call limit" in episode.turns[-1].observation


def test_verifier_never_reads_observations():
    d, task = _task()
    gold = d.gold_turns(task)
    episode, _ = play(d, task, [gold[-1]])  # finish at once
    forged = Episode(
        episode.completion, tuple(Turn(t.action, "goal reached", parts={"process": 1.0}) for t in episode.turns)
    )
    assert d.score(task, forged).value == 0.0


def test_cheats_are_rejected_in_one_turn_and_over_turns():
    d, task = _task(1)
    for cheat in d.cheats(task):
        assert not d.score(task, Episode(cheat)).passed and d.score(task, Episode(cheat)).value < 1.0
        episode, _ = play(d, task, [cheat] * d.budget.turns)
        assert d.score(task, episode).value == 0.0
