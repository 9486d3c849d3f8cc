"""The terminal loop: commands from the action's fenced shell blocks (else its raw
text), observations of stdout, stderr and exit code, an explicit `done`; each
step's end-state check is its execution result, which the verifier reads; the
declared cheats fail through the loop as they do through a single script."""

from __future__ import annotations

import os

import pytest

from posttrain import sandbox
from posttrain.domains import terminal as T
from posttrain.domains.base import play_actions, stable_rng
from posttrain.domains.registry import get
from posttrain.envs.base import StepResult
from posttrain.errors import SandboxError
from posttrain.types import Episode, Turn

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the fork-server sandbox backend needs root")
TERM = get("terminal")


def _template_task(name):
    inst = T.templates().TEMPLATES[name](stable_rng("test", name))
    return TERM._make(0, "train", inst["level"], name, inst["prompt"], inst)


def _play(task, actions):
    """Step a fresh environment through `actions` until done; the Episode the driver would build."""
    return play_actions(TERM.environment()(), task, actions)


@pytest.mark.parametrize(
    "text,commands,done",
    [
        ("```bash\nls -l\n```", "ls -l", False),
        ("```sh\nls\n```\ndone", "ls", True),
        ("First:\n```bash\ncd notes\n```\nthen\n```\nls\n```\nDone", "cd notes\nls", True),
        ("```bash\nfor f in *; do\n  echo $f\ndone\n```", "for f in *; do\n  echo $f\ndone", False),
        ("```python\nprint(1)\n```\n```bash\necho hi\n```", "echo hi", False),
        ("echo raw", "echo raw", False),
        ("  done \n", "", True),
        ("", "", False),
    ],
)
def test_commands_and_done_are_parsed_from_the_action(text, commands, done):
    assert T.parse_action(text) == (commands, done)


def test_the_prompt_says_how_to_answer_and_how_to_finish():
    text = TERM.sample(0, "train", 1).prompt[0].content
    assert "```bash" in text and "stdout, stderr and exit code" in text and "`done` on its own line" in text


@root_only
def test_the_loop_observes_output_and_exit_code_and_ends_on_done():
    task = _template_task("fix_port")
    env = TERM.environment()()
    assert env.reset(task) == ""
    first = env.step("```bash\necho out; echo err >&2; exit 3\n```")
    assert isinstance(first, StepResult) and not first.done and first.parts == {"process": 0.0}
    assert first.observation == "stdout:\nout\n\nstderr:\nerr\n\nexit code: 3"
    assert first.exec_result.exit_code == 3 and first.exec_result.checks and not all(first.exec_result.checks)
    nothing = env.step("I will look first.")  # raw text runs as commands: a failing one
    assert "command not found" in nothing.observation and nothing.parts == {"process": 0.0}
    empty = env.step("")
    assert "No command found" in empty.observation and not empty.done and empty.exec_result is nothing.exec_result
    gold = env.step(TERM.gold(task))
    assert gold.done and gold.parts == {"process": 1.0} and all(gold.exec_result.checks)
    assert "checks" not in gold.observation and "True" not in gold.observation  # the verdict is never observed
    env.close()


@root_only
def test_gold_trajectory_scores_one_wrong_less_and_parts_are_named(monkeypatch):
    task = _template_task("rename_ext")
    episode = _play(task, TERM.gold_turns(task))
    assert len(episode.turns) == 1
    # the verifier reads the last step's result: no sandbox call of its own
    monkeypatch.setattr(sandbox, "get_pool", lambda: (_ for _ in ()).throw(AssertionError("sandbox call in score")))
    s = TERM.score(task, episode)
    assert s.value == 1.0 and s.passed and s.parts == {"outcome": 1.0, "efficiency": 1.0, "process": 1.0}
    monkeypatch.undo()
    wrong = _play(task, ["```bash\nls notes\n```", TERM.wrong(task)])
    s = TERM.score(task, wrong)
    assert s.value < 1.0 and not s.passed and s.parts["efficiency"] == 0.5 and s.parts["process"] == 1.0


@root_only
def test_a_done_alone_after_commands_keeps_their_end_state():
    task = _template_task("fix_port")
    script = T.extract_script(TERM.gold(task))
    episode = _play(task, [f"```bash\n{script}```", "done"])
    assert [t.observation for t in episode.turns][-1] == "Done." and TERM.score(task, episode).value == 1.0
    assert episode.turns[-1].parts == {}  # a turn without commands has no process part


@root_only
def test_replay_without_an_execution_result_extracts_the_commands():
    """A direct `score` of turns (no execution result) replays each turn's fenced
    commands, not the raw text (which fails with `command not found`)."""
    task = _template_task("fix_port")
    turns = (Turn("Let me fix it:\n" + TERM.gold(task)),)
    assert TERM.score(task, Episode(turns[0].action, turns)).value == 1.0


@root_only
@pytest.mark.parametrize("cheat", sorted(T.CHEATS))
def test_declared_cheats_fail_through_the_loop(cheat):
    task = _template_task("fix_port")
    episode = _play(task, [f"```bash\n{T.CHEATS[cheat]}```", "done"])
    s = TERM.score(task, episode)
    assert s.value < 1.0 and not s.passed, (cheat, s)


def test_infra_error_in_a_step_raises_sandbox_error(monkeypatch):
    class Broken:
        def session(self, *a, **k):
            raise SandboxError("no worker")

    monkeypatch.setattr(sandbox, "get_pool", lambda: Broken())
    env = TERM.environment()()
    env.reset(_template_task("fix_port"))
    with pytest.raises(SandboxError):
        env.step("```bash\nls\n```")
