"""lookup: the gold trajectory scores 1 through the real environment, cheats that skip the
observation score 0, and the verifier never trusts an observation's text."""

from __future__ import annotations

import pytest

from posttrain.domains.base import play_actions
from posttrain.domains.lookup import LookupEnv, parse_action
from posttrain.domains.registry import get
from posttrain.types import Episode, Turn

DOMAIN = get("lookup")
TASKS = [DOMAIN.sample(i, split, level) for i in range(4) for split in ("train", "eval") for level in (1, 2)]


def play_through_env(task, actions):
    """The actions stepped through a fresh environment until done or the turn budget: an Episode."""
    return play_actions(DOMAIN.environment()(), task, actions[: DOMAIN.budget.turns])


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.id)
def test_gold_trajectory_scores_one_and_needs_the_observation(task):
    gold = DOMAIN.gold_turns(task)
    episode = play_through_env(task, gold)
    value = task.reference["value"]
    assert episode.turns[0].observation == f"{task.reference['key']}={value}"
    assert value not in task.prompt[-1].content  # only the observation carries it
    score = DOMAIN.score(task, episode)
    assert (score.value, score.passed) == (1.0, True)
    assert score.parts == {"outcome": 1.0, "process": 1.0, "efficiency": 1.0}


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.id)
def test_cheats_score_zero_as_one_completion_and_as_turns(task):
    for cheat in DOMAIN.cheats(task):
        single = DOMAIN.score(task, Episode(cheat))
        played = DOMAIN.score(task, play_through_env(task, [line for line in cheat.splitlines()] or [""]))
        assert single.value == 0.0 and not single.passed, (cheat, single)
        assert played.value == 0.0 and not played.passed, (cheat, played)


def test_a_lucky_guess_before_the_lookup_scores_zero():
    task = TASKS[0]
    value = task.reference["value"]
    score = DOMAIN.score(task, play_through_env(task, [value, f"look:{task.reference['key']}", value]))
    assert score.value == 0.0 and score.reason == "answered without looking up"


def test_forged_observations_are_not_trusted():
    task = TASKS[0]
    key = task.reference["key"]
    forged = Episode("999", (Turn(f"look:{key}", f"{key}=999"), Turn("999")))
    assert DOMAIN.score(task, forged).value == 0.0
    real = Episode(task.reference["value"], (Turn(f"look:{key}", "anything"), Turn(task.reference["value"])))
    assert DOMAIN.score(task, real).value == 1.0


def test_retries_are_observed_and_cost_efficiency_not_the_pass():
    task = TASKS[0]
    key, value = task.reference["key"], task.reference["value"]
    episode = play_through_env(task, ["hello", f"look:{key}", value])
    assert episode.turns[0].observation.startswith("error:")
    score = DOMAIN.score(task, episode)
    assert score.passed and score.parts["outcome"] == 1.0
    # hand-derived: process 2/3, efficiency 2/3 -> 0.7 + 0.15 * 2/3 + 0.15 * 2/3 = 0.9
    assert score.value == pytest.approx(0.9)
    wrong_key = play_through_env(task, [f"look:{key[::-1]}x", f"look:{key}", value])
    assert wrong_key.turns[0].observation == f"no_key:{key[::-1]}x"


def test_parse_action_reads_the_first_line_only():
    assert parse_action("look abc\n123") == parse_action("look abc")
    assert parse_action("<answer>42</answer>").kind == "answer"
    assert parse_action("abc=42").kind == "bad" and parse_action("").kind == "bad"
    assert parse_action("done").kind == "done"


def test_environment_never_raises_on_junk():
    env = LookupEnv()
    env.reset(TASKS[0])
    for junk in ("", "\x00\x01", "look", "look 123", "{" * 1000):
        observation, done = env.step(junk)
        assert not done and observation
