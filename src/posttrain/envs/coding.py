"""The coding loop: the model writes code, the tests run in the sandbox, the
error output comes back as the next observation, the model revises.

Invariant: every attempt runs in a fresh sandbox, and whether it passed is
decided outside the solution's process (script_judge: a runner process that
holds the tests and talks to the solution, started in a fresh interpreter,
over a pipe, so an early exit fails; code_domain_judge: the `code` domain's
host-side comparison); an episode ends when an attempt
passes or the domain's turn budget is spent, and the reward is the domain
verifier's score of the final attempt (minus `turn_cost` per extra turn,
applied by the pipeline); a sandbox infra error raises SandboxError (the
pipeline retries or masks the group), it is never an observation or a score.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.errors import SandboxError, TaskError
from posttrain.types import Task

_BLOCK = re.compile(r"```(?:python|py|Python)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The last fenced code block, else the whole text."""
    blocks = _BLOCK.findall(text)
    return (blocks[-1] if blocks else text).strip() + "\n"


@dataclass(frozen=True)
class Attempt:
    passed: bool
    feedback: str
    status: str


@dataclass(frozen=True)
class CodingOutcome:
    """What the verifier sees as Episode.exec_result: every attempt, in order."""

    attempts: tuple[Attempt, ...] = field(default_factory=tuple)

    @property
    def passed(self) -> bool:
        return bool(self.attempts) and self.attempts[-1].passed


Judge = Callable[[Task, str], Attempt]
"""Runs one attempt's code against the task's tests in the sandbox."""


def _tail(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else "..." + text[-limit:]


_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "domains", "data", "code")


def _data(name: str) -> str:
    with open(os.path.join(_DATA, name)) as fh:
        return fh.read()


def script_judge(runner: Callable[[Any], Any] | None = None, feedback_chars: int = 800) -> Judge:
    """Tests as a Python script (task.reference["tests"]) that imports `solution`;
    it passes when the script ends normally. The script runs in its own process
    (data/code/script_runner.py, the tests on stdin) and `solution` is a proxy
    to the solution running in a fresh interpreter (script_solver.py): values
    cross as plain data, so the solution never sees the tests and cannot end
    the run early with a pass (`sys.exit(0)` at import fails). Arguments and
    return values must be builtin data (objects of the solution come back as
    handles: call them, read their attributes, index, iterate). The feedback is
    the tail of stderr (the traceback and the assertion message). `runner`
    defaults to the process-wide sandbox pool."""

    def judge(task: Task, code: str) -> Attempt:
        from posttrain import sandbox

        ref = task.reference
        if not isinstance(ref, dict) or not isinstance(ref.get("tests"), str):
            raise TaskError(f"task {task.id}: coding loop needs reference['tests'] (a Python test script)")
        files = {
            "script_runner.py": _data("script_runner.py"),
            "script_solver.py": _data("script_solver.py"),
            "solution.py": code,
        }
        req = sandbox.ExecRequest(files=files, python_main="script_runner.py", stdin=ref["tests"].encode(),
                                  limits=sandbox.Limits(wall_s=float(ref.get("timeout_s", 5.0))))
        res = sandbox.raise_for_infra((runner or sandbox.run)(req))
        if res.status == "ok":
            return Attempt(True, "All tests passed.", res.status)
        err = res.stderr.decode("utf-8", "replace") or res.stdout.decode("utf-8", "replace")
        return Attempt(
            False, f"Tests failed ({res.status}, exit code {res.exit_code}):\n{_tail(err, feedback_chars)}", res.status
        )

    return judge


def code_domain_judge(runner: Callable[[Any], Any] | None = None) -> Judge:
    """The `code` domain's hidden tests: the sandbox runs the inputs, the host
    compares; the feedback names how many tests passed and why the others
    failed (the tests stay hidden)."""

    def judge(task: Task, code: str) -> Attempt:
        from posttrain.domains.code import execute
        from posttrain.domains.code import judge as compare

        run = execute(task.reference, code, runner)
        score = compare(task.reference, run)
        total = len(run.outputs)
        passed = round(score.value * total)
        text = f"{passed}/{total} tests passed." + (f" Failures: {score.reason[:600]}" if score.reason else "")
        return Attempt(score.passed, text, run.status)

    return judge


class CodingEnv:
    """One coding episode. `step(action)` runs the action's code; the observation
    is the judge's feedback; done when the tests pass."""

    def __init__(self, judge: Judge | None = None, turn_cost: float = 0.0) -> None:
        if not 0.0 <= turn_cost <= 1.0:
            raise ValueError(f"CodingEnv.turn_cost must be in [0, 1], got {turn_cost!r}")
        self.judge = judge or script_judge()
        self.turn_cost = turn_cost
        self._task: Task | None = None
        self._attempts: list[Attempt] = []

    def reset(self, task: Task) -> str:
        self._task, self._attempts = task, []
        return ""

    def step(self, action: str) -> tuple[str, bool]:
        if self._task is None:
            raise SandboxError("CodingEnv.step before reset")
        code = extract_code(action)
        attempt = (
            Attempt(False, "No code found: answer with one ```python code block.", "no_code")
            if not code.strip()
            else self.judge(self._task, code)
        )
        self._attempts.append(attempt)
        return attempt.feedback, attempt.passed

    def outcome(self) -> CodingOutcome:
        return CodingOutcome(tuple(self._attempts))
