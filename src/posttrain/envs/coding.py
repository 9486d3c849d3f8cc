"""A test script against a solution, in the sandbox (`script_judge`).

Invariant: every attempt runs in a fresh sandbox, and whether it passed is
decided outside the solution's process: a runner process holds the tests and
talks to the solution, started in a fresh interpreter, over a pipe, so an
early exit fails; a sandbox infra error raises SandboxError, it is never an
attempt that failed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.errors import TaskError
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
        req = sandbox.ExecRequest(
            files=files,
            python_main="script_runner.py",
            stdin=ref["tests"].encode(),
            limits=sandbox.Limits(wall_s=float(ref.get("timeout_s", 5.0))),
        )
        res = sandbox.raise_for_infra((runner or sandbox.run)(req))
        if res.status == "ok":
            return Attempt(True, "All tests passed.", res.status)
        err = res.stderr.decode("utf-8", "replace") or res.stdout.decode("utf-8", "replace")
        return Attempt(
            False, f"Tests failed ({res.status}, exit code {res.exit_code}):\n{_tail(err, feedback_chars)}", res.status
        )

    return judge
