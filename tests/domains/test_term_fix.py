"""term_fix, the terminal family's feedback tier: the gold passes through the loop and as one
completion; on a stale task the first attempt fails and the visible checker's line names the
value the revision needs; every cheat scores below the gold (one completion and an episode);
the stale share is what the module states; observations are only the commands' output, short
and tokenizable; malformed actions are observations; the buggy policy fails in its stated
ways."""

from __future__ import annotations

import collections

import pytest

from posttrain.domains import term_fix as TF
from posttrain.domains.registry import get
from posttrain.model.bugs import term_fix_buggy
from posttrain.model.tokenizer import CHARS
from posttrain.types import Episode

D = get("term_fix")


def _tasks(n: int, split: str = "train", level: int = 1):
    return [D.sample(i, split, level) for i in range(n)]


def _stale_and_fresh(level: int = 1):
    tasks = _tasks(12, "train", level)
    return next(t for t in tasks if t.reference.stale), next(t for t in tasks if not t.reference.stale)


def _lines_as_turns(completion: str) -> list[str]:
    return TF.completion_actions(completion)


def test_the_stale_share_is_about_what_is_stated():
    for level in (1, 2):
        tasks = _tasks(1500, "train", level) + _tasks(500, "eval", level)
        share = sum(t.reference.stale for t in tasks) / len(tasks)
        assert abs(share - TF.STALE_SHARE) < 0.04, (level, share)


def test_tasks_are_distinct_short_and_tokenizable():
    for level in (1, 2):
        tasks = _tasks(300, "eval", level)
        prompts = [t.prompt[-1].content for t in tasks]
        assert len(set(prompts)) >= 295
        for t in tasks:
            assert len(t.prompt[-1].content) <= 60 and set(t.prompt[-1].content) <= set(CHARS)
            for action in D.gold_turns(t):
                assert len(action) <= 30 and set(action) <= set(CHARS)
            assert t.meta.split == "eval" and t.meta.difficulty == level


@pytest.mark.parametrize("level", [1, 2])
def test_gold_passes_as_an_episode_and_as_one_completion(level):
    for task in _tasks(8, "train", level) + _tasks(4, "eval", level):
        ep = TF.replay(task, D.gold_turns(task))
        assert len(ep.turns) == (2 if task.reference.stale else 1)
        assert ep.turns[-1].observation == "ok"
        s = D.score(task, ep)
        assert s.value == 1.0 and s.passed, (task.id, s)
        one = D.score(task, Episode(D.gold(task)))
        assert one.value == 1.0 and one.passed, (task.id, one)


def test_the_checker_names_the_deviation_and_the_revision_uses_it():
    stale, fresh = _stale_and_fresh()
    ref = stale.reference
    ep = TF.replay(stale, D.gold_turns(stale)[:1])
    assert ep.turns[0].observation == f"out:{ref.spec}!={ref.value}"
    assert D.score(stale, ep).passed is False  # the spec's value alone fails on a stale task
    assert D.gold_turns(stale)[1] == f"echo {ref.value} >out;./chk"
    one = TF.replay(fresh, D.gold_turns(fresh))
    assert [t.observation for t in one.turns] == ["ok"] and D.score(fresh, one).passed


def test_wrong_and_every_cheat_score_below_the_gold():
    for task in _stale_and_fresh():
        gold = D.score(task, Episode(D.gold(task))).value
        for bad in [D.wrong(task), *D.cheats(task)]:
            one = D.score(task, Episode(bad))
            episode = D.score(task, TF.replay(task, _lines_as_turns(bad)))
            assert one.value < gold and not one.passed, (bad[:60], one)
            assert episode.value < gold and not episode.passed, (bad[:60], episode)


def test_observations_are_only_the_commands_output():
    stale, _ = _stale_and_fresh()
    ep = TF.replay(stale, ["ls -a", "cat out", "false"])
    ls, cat, false = (t.observation for t in ep.turns)
    assert ls.split() == [".", "..", "app.cfg", "chk"]  # no hidden check, checker or verdict in the directory
    assert "No such file" in cat and cat.endswith("[1]")
    assert false == "[1]"
    for t in ep.turns:
        assert len(t.observation) <= TF.OBS_CHARS and '"results"' not in t.observation
        assert not t.observation.count(stale.reference.checks_json[:20])


def test_malformed_actions_are_observations_not_exceptions():
    stale, _ = _stale_and_fresh()
    env = D.environment()()
    env.reset(stale)
    empty = env.step("")
    assert (empty.observation, empty.done) == ("no_command", False)
    broken = env.step("echo ((")
    assert not broken.done and broken.observation.endswith("[2]") and len(broken.observation) <= TF.OBS_CHARS
    assert broken.parts["process"] == 0.0
    ends = env.step("done")
    assert ends.done
    env.close()


def test_an_echoed_ok_ends_the_episode_but_the_state_decides():
    stale, _ = _stale_and_fresh()
    ep = TF.replay(stale, [f"echo {stale.reference.spec} >out;echo ok", "echo never"])
    assert len(ep.turns) == 1 and ep.turns[0].observation == "ok"
    assert not D.score(stale, ep).passed


def test_the_buggy_policy_fails_after_feedback_in_its_stated_ways():
    questions = [t.prompt[-1].content for t in _tasks(200)]
    kinds = collections.Counter()
    for q in questions:
        spec = q.split("spec:", 1)[1].split(";", 1)[0]
        first = term_fix_buggy(q, "")
        assert first == f"echo {spec} >out;./chk" == term_fix_buggy(q, "")
        revise = term_fix_buggy(q, f"out:{spec}!=123")
        assert revise != "echo 123 >out;./chk"
        named = {first: "resubmit", f"echo out:{spec}!=123 >out;./chk": "copy_line", "done": "stop"}
        kinds[named.get(revise, "rewrite_chk" if revise == "echo echo ok>chk;./chk" else revise)] += 1
    assert set(kinds) == {"resubmit", "copy_line", "stop", "rewrite_chk"} and min(kinds.values()) >= 30, kinds
    stale, fresh = _stale_and_fresh()
    for task, passes in ((stale, False), (fresh, True)):
        q, obs, actions = task.prompt[-1].content, "", []
        for _ in range(D.budget.turns):
            actions.append(term_fix_buggy(q, obs))
            ep = TF.replay(task, actions)
            if len(ep.turns) < len(actions) or ep.turns[-1].observation in ("ok", "done"):
                break
            obs = ep.turns[-1].observation
        assert D.score(task, TF.replay(task, actions)).passed is passes


def test_pretraining_transcripts_are_short_gold_and_buggy():
    from posttrain.model.pretrain import transcript

    stale, _ = _stale_and_fresh()
    gold = transcript(D, stale)
    assert [r for r, _ in gold] == ["user", "assistant", "tool", "assistant"]
    assert gold[2][1] == f"out:{stale.reference.spec}!={stale.reference.value}"
    assert sum(len(c) for _, c in gold) <= 130
    buggy = transcript(D, stale, term_fix_buggy)
    assert [c for r, c in buggy if r == "assistant"] != [c for r, c in gold if r == "assistant"]
