"""3D modelling as a loop: build, read the constraint report from a sandbox run,
adjust; done when every constraint holds. The reward comes from the final check
(the domain's execute step on the last script, then the verifier), never from an
observation."""

from __future__ import annotations

import re

import pytest

from posttrain import sandbox
from posttrain.domains.registry import get
from posttrain.errors import SandboxError
from posttrain.types import Episode, Turn


def play(domain, task, actions):
    """Drive the environment, then score as the pipeline does: the execute step on
    the last action gives Episode.exec_result."""
    env = domain.environment()()
    assert env.reset(task) == ""
    turns = []
    for action in actions[: domain.budget.turns]:
        got = env.step(action)
        turns.append(Turn(action, got.observation, got.exec_result, got.parts))
        if got.done:
            break
    env.close()
    last = turns[-1].action
    return Episode(last, tuple(turns), exec_result=domain.execute(task, last)), got.done


def test_gold_trajectory_is_done_at_once_and_scores_one():
    d = get("geo_box_hole")
    task = d.sample(0, "train", 1)
    assert "constraint report" in task.prompt[0].content and d.budget.turns == 3
    episode, done = play(d, task, d.gold_turns(task))
    assert done and len(episode.turns) == 1
    turn = episode.turns[0]
    assert turn.parts == {"process": 1.0} and turn.exec_result.measures["watertight"]
    assert "volume:" in turn.observation and "FAIL" not in turn.observation
    score = d.score(task, episode)
    assert score.value == 1.0 and score.passed and score.parts["efficiency"] == 1.0


def test_the_report_says_what_to_adjust_and_the_fix_scores_one():
    d = get("geo_box_hole")
    task = d.sample(0, "train", 1)
    episode, done = play(d, task, [d.wrong(task), d.gold(task)])
    first = episode.turns[0]
    assert done and len(episode.turns) == 2
    assert re.search(r"volume: .*: FAIL", first.observation) and re.search(r"bounding box: .*: FAIL", first.observation)
    assert "parts: 1 (target 1): ok" in first.observation and 0.0 < first.parts["process"] < 1.0
    score = d.score(task, episode)
    assert score.value == 1.0 and score.passed and score.parts["efficiency"] == 0.5


def test_failures_are_reported_not_raised_and_the_budget_ends_the_episode():
    d = get("geo_box")
    task = d.sample(0, "train", 1)
    episode, done = play(
        d, task, ["no code here", "```python\nraise SystemExit(3)\n```", "```python\nprint('done')\n```", d.gold(task)]
    )
    assert not done and len(episode.turns) == 3  # the gold came too late
    assert "exit code 3" in episode.turns[1].observation
    assert episode.turns[2].observation.startswith("no readable mesh")
    assert all(t.parts == {"process": 0.0} for t in episode.turns)
    assert d.score(task, episode).value == 0.0


def test_verifier_never_reads_observations():
    d = get("geo_box")
    task = d.sample(0, "train", 1)
    cheat = "```python\nprint('done')\n```"
    forged = Episode(
        cheat, (Turn(cheat, "watertight: yes ... ok", parts={"process": 1.0}),), exec_result=d.execute(task, cheat)
    )
    assert d.score(task, forged).value == 0.0


def test_cheats_fail_over_turns():
    d = get("geo_cylinder")
    task = d.sample(0, "train", 1)
    proxy = d.proxy_script(task)
    for cheat in d.cheats(task):
        episode, done = play(d, task, [cheat] * 3)
        s = d.score(task, episode)
        assert not done and not s.passed and s.value < 1.0, (cheat[:60], s)
        if cheat != proxy:  # the proxy meets every scalar check: only its shape fails
            assert s.value == 0.0, (cheat[:60], s)


def test_a_sandbox_fault_in_a_step_raises_sandbox_error(monkeypatch):
    d = get("geo_box")
    task = d.sample(0, "train", 1)
    monkeypatch.setattr(sandbox, "run", lambda req: sandbox.ExecResult("infra_error", error="pool died"))
    env = d.environment()()
    env.reset(task)
    with pytest.raises(SandboxError, match="pool died"):
        env.step(d.gold(task))
