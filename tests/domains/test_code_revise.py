"""The coding loop (`code_revise`): the model writes code, the environment runs the
VISIBLE tests in the sandbox and observes the failure, the model revises; the
HIDDEN tests, run by the execute step on the last answer, decide the reward.
The hidden tests never reach an environment step (neither its sandbox request
nor its observation); `code` stays single-turn."""

from __future__ import annotations

import json
import os

import pytest

from posttrain import sandbox
from posttrain.domains import code as C
from posttrain.domains.registry import get
from posttrain.envs.base import StepResult
from posttrain.errors import SandboxError
from posttrain.types import Episode, Turn

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the fork-server sandbox backend needs root")
LOOP = get("code_revise")


def _task(name: str):
    for level in (1, 2, 3):
        for split in ("train", "eval"):
            for i in range(40):
                task = LOOP.sample(i, split, level)
                if task.reference.name == name:
                    return task
    raise AssertionError(name)


class Recording:
    """The real process-wide sandbox, recording every request."""

    def __init__(self) -> None:
        self.requests: list = []
        self.real = sandbox.run

    def __call__(self, req, *, domain=None):
        self.requests.append((req, domain))
        return self.real(req, domain=domain)


def test_every_task_has_visible_and_hidden_tests_and_the_prompt_shows_only_the_visible():
    for t in C.load_tasks():
        assert t.visible and len(t.visible) < len(t.tests), t.name
    for level in (1, 2, 3):
        task = LOOP.sample(0, "train", level)
        ref = task.reference
        prompt = task.prompt[0].content
        assert "Visible tests" in prompt and "Hidden tests decide the score" in prompt
        for inp in ref.visible.inputs():
            assert C.render_call(ref.visible, inp) in prompt
        for inp in ref.hidden.inputs():
            assert C.render_call(ref.hidden, inp) not in prompt
        assert LOOP.budget.turns > 1 and LOOP.environment() is C.CodeRevisionEnv
    assert get("code").environment() is None and get("code").budget.turns == 1  # `code` stays single-turn


def test_code_and_code_revise_share_their_eval_split():
    def names(domain, split):
        return {domain.sample(i, split, lvl).reference.name for lvl in (1, 2, 3) for i in range(40)}

    code = get("code")
    assert names(code, "eval") == names(LOOP, "eval") and names(code, "train") == names(LOOP, "train")
    assert not names(LOOP, "eval") & names(LOOP, "train")


def test_visible_tests_never_take_the_last_test_the_wrong_solution_fails():
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("code_build", os.path.join(C.DATA, "build.py"))
    build = module_from_spec(spec)
    spec.loader.exec_module(build)
    assert build.visible_tests([False] * 6) == [0, 1]
    assert build.visible_tests([False, True, False, False, False, False]) == [0, 2]  # test 1 stays hidden
    assert build.visible_tests([True, False, False]) == [1]
    assert build.visible_tests([True, True]) == [0]


@root_only
def test_the_loop_observes_the_failure_and_ends_when_the_visible_tests_pass():
    task = _task("clamp")
    env = LOOP.environment()()
    assert env.reset(task) == ""
    wrong = env.step(LOOP.wrong(task))
    assert isinstance(wrong, StepResult) and not wrong.done
    assert "FAILED clamp(5, 0, 10)" in wrong.observation and "expected: 5" in wrong.observation
    assert "got:      0" in wrong.observation and wrong.parts == {"process": 0.5}
    assert wrong.exec_result.suite == "visible" and len(wrong.exec_result.outputs) == 2

    raised = env.step("```python\ndef clamp(x, lo, hi):\n    return x / (lo - lo)\n```")
    assert "Traceback" in raised.observation and 'File "solution.py", line 2, in clamp' in raised.observation
    assert "ZeroDivisionError" in raised.observation and raised.parts == {"process": 0.0}
    syntax = env.step("```python\ndef clamp(x, lo, hi:\n    return x\n```")
    assert "SyntaxError" in syntax.observation and "(line 1)" in syntax.observation
    none = env.step("")
    assert "No code found" in none.observation and not none.done and none.exec_result is None

    gold = env.step(LOOP.gold(task))
    assert gold.done and gold.parts == {"process": 1.0} and gold.observation == "Visible tests: 2 of 2 passed."
    env.close()


@root_only
def test_class_tasks_show_the_call_sequence():
    task = _task("MinStack")
    env = LOOP.environment()()
    env.reset(task)
    got = env.step(LOOP.wrong(task))
    assert "MinStack(); push(" in task.prompt[0].content and "-> returns [None" in task.prompt[0].content
    assert got.parts["process"] in (0.0, 1.0) and got.exec_result.suite == "visible"


@root_only
def test_no_hidden_test_reaches_an_environment_step(monkeypatch):
    """The step's sandbox request holds the visible inputs only (no expected value,
    no hidden input), and no observation names a hidden input."""
    recording = Recording()
    monkeypatch.setattr(sandbox, "run", recording)
    for name in ("clamp", "gcd_all", "edit_distance", "TimeMap"):
        task = _task(name)
        ref = task.reference
        env = LOOP.environment()()
        env.reset(task)
        observations = [env.step(a).observation for a in [LOOP.wrong(task), *LOOP.cheats(task), LOOP.gold(task)]]
        for req, domain in recording.requests:
            spec = json.loads(req.stdin)
            assert domain == "code_revise" and spec["inputs"] == ref.visible.inputs() and spec["explain"] is True
            assert b"expected" not in req.stdin
            blob = req.stdin + b"".join(v if isinstance(v, bytes) else v.encode() for v in req.files.values())
            for inp in ref.hidden.inputs():
                assert json.dumps(inp).encode() not in blob
        for obs in observations:
            for inp in ref.hidden.inputs():
                assert C.render_call(ref.hidden, inp) not in obs
        recording.requests.clear()


@root_only
def test_hidden_tests_decide_the_reward_and_the_parts_are_named():
    task = _task("gcd_all")
    ran = LOOP.execute(task, LOOP.gold(task))
    assert ran.suite == "hidden" and len(ran.outputs) == len(task.reference.hidden.inputs())
    turns = (Turn(LOOP.wrong(task), parts={"process": 0.5}), Turn(LOOP.gold(task), parts={"process": 1.0}))
    s = LOOP.score(task, Episode(LOOP.gold(task), turns, exec_result=ran))
    # moved: these turns hold no visible run, so both read as "no code": the same behaviour
    assert s.passed and s.value == 1.0 and s.parts == {"outcome": 1.0, "process": 0.75, "efficiency": 0.5, "moved": 0.0}
    # the wrong solution of gcd_all passes the visible tests but not the hidden ones
    env = LOOP.environment()()
    env.reset(task)
    assert env.step(LOOP.wrong(task)).done
    wrong = LOOP.score(
        task,
        Episode(
            LOOP.wrong(task),
            (Turn(LOOP.wrong(task), parts={"process": 1.0}),),
            exec_result=LOOP.execute(task, LOOP.wrong(task)),
        ),
    )
    assert 0.0 < wrong.value < 1.0 and not wrong.passed and wrong.parts["process"] == 1.0


@root_only
def test_score_reads_the_execute_steps_result_and_never_a_visible_run(monkeypatch):
    task = _task("clamp")
    hidden = LOOP.execute(task, LOOP.gold(task))
    env = LOOP.environment()()
    env.reset(task)
    visible = env.step(LOOP.gold(task)).exec_result
    calls = []
    monkeypatch.setattr(sandbox, "run", lambda req, domain=None: calls.append(req) or sandbox.ExecResult("infra_error"))
    assert LOOP.score(task, Episode(LOOP.gold(task), exec_result=hidden)).value == 1.0 and not calls
    with pytest.raises(SandboxError):  # a visible run is not the verdict: the hidden tests run (here: infra error)
        LOOP.score(task, Episode(LOOP.wrong(task), exec_result=visible))
    assert len(calls) == 1


@root_only
def test_gold_trajectory_scores_one_and_every_cheat_less():
    for name in ("clamp", "TimeMap", "edit_distance"):
        task = _task(name)
        env = LOOP.environment()()
        env.reset(task)
        turns = []
        for action in LOOP.gold_turns(task):
            got = env.step(action)
            turns.append(Turn(action, got.observation, got.exec_result, got.parts))
        assert got.done
        episode = Episode(turns[-1].action, tuple(turns), exec_result=LOOP.execute(task, turns[-1].action))
        assert LOOP.score(task, episode).value == 1.0
        cheats = LOOP.cheats(task)
        assert len(cheats) == len(C.CHEATS) + (task.reference.hidden.kind == "function")
        for cheat in cheats:
            s = LOOP.score(task, Episode(cheat))
            assert s.value < 1.0 and not s.passed, (name, cheat[:60], s)


@root_only
def test_the_visible_answer_table_passes_the_visible_tests_only():
    task = _task("edit_distance")
    table = LOOP.cheats(task)[-1]
    env = LOOP.environment()()
    env.reset(task)
    assert env.step(table).done  # it fools the visible tests...
    assert LOOP.score(task, Episode(table)).value == 0.0  # ...and scores nothing on the hidden ones


@root_only
def test_the_code_domain_run_carries_no_traceback():
    task = get("code").sample(0, "train", 1)
    ran = get("code").execute(task, f"```python\ndef {task.reference.name}(*a):\n    raise ValueError('x')\n```")
    assert ran.suite == "all" and all(
        o.kind == "raised" and o.detail == "ValueError" and not o.trace for o in ran.outputs
    )


def test_infra_error_in_a_step_raises_sandbox_error(monkeypatch):
    monkeypatch.setattr(sandbox, "run", lambda req, domain=None: sandbox.ExecResult("infra_error", error="died"))
    task = _task("clamp")
    env = LOOP.environment()()
    env.reset(task)
    with pytest.raises(SandboxError):
        env.step(LOOP.gold(task))
