"""doc_fix: the gold trajectory passes through the real validator, the printed total is stale on
about the stated share, the report names the field and the submitted items' sum (never a hidden
value), every cheat scores below the gold as one completion and as an episode, and the verifier
never trusts an observation's text."""

from __future__ import annotations

import pytest

from posttrain.domains.base import play_actions
from posttrain.domains.docfix import STALE_SHARE, DocFixEnv, parse_action, report
from posttrain.domains.registry import get
from posttrain.envs.base import as_step_result
from posttrain.model.bugs import TURN_BUGS
from posttrain.model.pretrain import transcript
from posttrain.types import Episode, Turn

DOMAIN = get("doc_fix")
TASKS = [DOMAIN.sample(i, split, level) for i in range(30) for split in ("train", "eval") for level in (1, 2)]


def play_through_env(task, actions):
    """The actions stepped through a fresh environment until done or the turn budget: an Episode."""
    return play_actions(DOMAIN.environment()(), task, actions[: DOMAIN.budget.turns])


@pytest.mark.parametrize("task", TASKS[:16], ids=lambda t: t.id)
def test_gold_trajectory_passes_and_uses_the_report_when_the_print_is_stale(task):
    gold = DOMAIN.gold_turns(task)
    episode = play_through_env(task, gold)
    total = task.reference["fields"]["tot"]
    if task.reference["stale"]:
        assert len(episode.turns) == 2 and episode.turns[0].observation == f"tot_not_sum:{total}"
        assert f"tot={total}" not in task.prompt[-1].content  # only the report carries the true total
    else:
        assert len(episode.turns) == 1 and episode.turns[0].observation == "ok"
    assert episode.turns[-1].observation == "ok"
    for ep in (episode, Episode(DOMAIN.gold(task))):
        score = DOMAIN.score(task, ep)
        assert (score.value, score.passed) == (1.0, True)
        assert score.parts["efficiency"] == 1.0 and score.parts["process"] == 1.0


def test_the_stale_share_is_about_the_stated_one():
    many = [DOMAIN.sample(i, "train", 1) for i in range(600)]
    share = sum(t.reference["stale"] for t in many) / len(many)
    assert abs(share - STALE_SHARE) < 0.06, share
    for t in many:
        printed, fields = t.reference["printed"], t.reference["fields"]
        assert {k: v for k, v in printed.items() if k != "tot"} == {k: v for k, v in fields.items() if k != "tot"}
        assert (printed["tot"] != fields["tot"]) == t.reference["stale"]
        assert 100 <= printed["tot"] <= 999 and len(t.prompt[-1].content) <= 60


def test_questions_are_distinct_and_the_splits_do_not_share_one():
    train = {DOMAIN.sample(i, "train", 1).prompt[-1].content for i in range(300)}
    held = {DOMAIN.sample(i, "eval", 1).prompt[-1].content for i in range(300)}
    assert min(len(train), len(held)) >= 295 and not train & held  # a repeat within a split is chance


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.id)
def test_cheats_score_below_the_gold_as_one_completion_and_as_turns(task):
    for cheat in DOMAIN.cheats(task):
        single = DOMAIN.score(task, Episode(cheat))
        played = DOMAIN.score(task, play_through_env(task, cheat.splitlines() or [""]))
        assert single.value < 0.5 and not single.passed, (cheat, single)
        assert played.value < 0.5 and not played.passed, (cheat, played)
    wrong = DOMAIN.score(task, Episode(DOMAIN.wrong(task)))
    assert wrong.value < 1.0 and not wrong.passed


def test_an_object_the_validator_accepts_can_still_fail_the_hidden_check():
    task = next(t for t in TASKS if t.reference["stale"])
    printed = dict(task.reference["printed"])
    printed["a"] = printed["tot"] - sum(v for k, v in printed.items() if k not in ("a", "tot"))
    line = ",".join(f"{k}={v}" for k, v in printed.items())
    episode = play_through_env(task, [line])
    assert episode.turns[0].observation == "ok"  # the visible check passes
    score = DOMAIN.score(task, episode)
    assert not score.passed and score.parts["process"] == 1.0 and score.parts["outcome"] == 0.0


def test_the_report_is_a_function_of_the_submission_alone():
    keys = ("a", "b", "tot")
    assert report({"a": "120", "b": "24", "tot": "154"}, keys) == "tot_not_sum:144"
    assert report({"a": 120, "b": 24, "tot": 144}, keys) == "ok"
    assert report({"a": "121", "b": "24", "tot": "154"}, keys) == "tot_not_sum:145"  # a misread item moves the sum
    assert report({"a": "1", "b": "2"}, keys) == "missing:tot"
    assert report({"a": "1", "b": "2", "tot": "3", "x": "1"}, keys) == "unknown:x"
    assert report({"a": True, "b": "2", "tot": "3"}, keys) == "nan:a"
    assert report({"a": 1.5, "b": "2", "tot": "3"}, keys) == "nan:a"
    # the environment reads only the asked keys: poisoning the hidden gold changes no observation
    task = TASKS[0]
    poisoned = type(task)(
        id=task.id,
        domain=task.domain,
        prompt=task.prompt,
        reference={**task.reference, "fields": dict.fromkeys(task.reference["fields"], 0), "printed": {}},
        meta=task.meta,
    )
    actions = ["a=1,b=2,tot=9", "junk", DOMAIN.gold_turns(task)[0]]
    assert [t.observation for t in play_through_env(task, actions).turns] == [
        t.observation for t in play_through_env(poisoned, actions).turns
    ]


def test_forged_observations_are_not_trusted():
    task = next(t for t in TASKS if t.reference["stale"])
    printed = ",".join(f"{k}={v}" for k, v in task.reference["printed"].items())
    forged = Episode(printed, (Turn(printed, "ok"),))
    assert not DOMAIN.score(task, forged).passed
    gold = DOMAIN.gold_turns(task)
    real = Episode(gold[-1], (Turn(gold[0], "anything"), Turn(gold[1], "ok")))
    assert DOMAIN.score(task, real).value == 1.0


def test_retries_are_observed_and_cost_efficiency_not_the_pass():
    task = next(t for t in TASKS if t.reference["stale"])
    gold = DOMAIN.gold_turns(task)
    episode = play_through_env(task, ["hello", gold[0], gold[1]])
    assert episode.turns[0].observation == "error:say_" + ",".join(f"{k}=N" for k in task.reference["fields"])
    score = DOMAIN.score(task, episode)
    assert score.passed
    # hand-derived: 2 turns needed, 3 used -> 0.85 + 0.15 * 2/3 = 0.95
    assert score.value == pytest.approx(0.95)
    # a stale task solved in one turn (the model added the items itself) is fully efficient
    assert DOMAIN.score(task, Episode(gold[1])).value == 1.0


def test_malformed_actions_are_observations_not_exceptions():
    env = DocFixEnv()
    env.reset(TASKS[0])
    for junk in ("", "\x00\x01", "a=", "a=1,a=2,tot=3", "{" * 1000, "<answer>[1]</answer>", "tot_not_sum:144"):
        result = as_step_result(env.step(junk))
        assert not result.done and result.observation.startswith(("error:", "missing:"))
    assert parse_action("a=1,b=2\nhello").fields == {"a": "1", "b": "2"}
    assert parse_action('<answer>{"a": 1}</answer>').fields == {"a": 1}
    assert as_step_result(env.step("done")).done


def test_the_buggy_policy_mixes_its_stated_mistakes_and_copies_the_print_first():
    bug = TURN_BUGS["doc_fix"]
    stale = [t for t in (DOMAIN.sample(i, "train", 1) for i in range(200)) if t.reference["stale"]]
    kinds = set()
    for task in stale:
        messages = transcript(DOMAIN, task, bug)
        assert messages[1][1] == DOMAIN.gold_turns(task)[0]  # the first attempt is the gold's
        assert not DOMAIN.score(task, Episode(messages[-1][1])).passed
        second = messages[3][1]
        printed = ",".join(f"{k}={v}" for k, v in task.reference["printed"].items())
        kinds.add(
            "resubmit"
            if second == printed
            else "report"
            if second.startswith("tot_not_sum")
            else "a"
            if not second.startswith(printed[:5])
            else "tot"
        )
    assert kinds == {"resubmit", "report", "a", "tot"}
    fresh = next(t for t in TASKS if not t.reference["stale"])
    assert DOMAIN.score(fresh, Episode(transcript(DOMAIN, fresh, bug)[-1][1])).passed
