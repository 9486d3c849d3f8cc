"""code: write a Python function (or class) that passes hidden unit tests.

Invariant: the reward is the pass rate of the task's hidden tests, judged in
one sandbox call per completion by data/code/harness.py, which never lets
the solution share a process with the tests (see its docstring); a sandbox
infra error raises SandboxError and is never a score. 61 tasks written for
posttrain in three levels (data/code/tasks_l*.py, built into tasks.json);
a task's split is fixed by a hash of its prompt.
"""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from functools import lru_cache

from posttrain.domains.base import Budget, Domain, last_fenced_block, split_of
from posttrain.domains.registry import register
from posttrain.errors import TaskError
from posttrain.types import Episode, Message, Score, Split, Task, TaskMeta

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "code")
INSTRUCTION = "Answer with the complete Python code in one ```python code block; do not print anything or read input."
TEST_TIMEOUT_S = {1: 2.0, 2: 2.0, 3: 4.0}


@dataclass(frozen=True)
class CodeReference:
    """What the verifier needs: the entry point and the hidden tests."""

    name: str
    kind: str  # "function" or "class"
    mode: str  # "exact", "approx" or "unordered"
    tests_json: str  # the hidden tests, [{"args"|"calls": ..., "expected": ...}]
    timeout_s: float


@dataclass(frozen=True)
class CodeTask:
    name: str
    level: int
    kind: str
    mode: str
    prompt: str
    solution: str
    wrong: str
    tests: tuple


@lru_cache(maxsize=1)
def load_tasks() -> tuple[CodeTask, ...]:
    try:
        with open(os.path.join(DATA, "tasks.json")) as fh:
            raw = json.load(fh)
    except (OSError, ValueError) as exc:
        raise TaskError(f"code: cannot read {DATA}/tasks.json: {exc}") from exc
    return tuple(CodeTask(t["name"], t["level"], t["kind"], t["mode"], t["prompt"], t["solution"], t["wrong"], tuple(t["tests"]))
                 for t in raw)


@lru_cache(maxsize=1)
def harness_source() -> str:
    with open(os.path.join(DATA, "harness.py")) as fh:
        return fh.read()


def extract_code(text: str) -> str:
    """The last fenced code block of the completion, else the whole text."""
    return last_fenced_block(text, ("python", "py", "Python"))


def build_request(ref: CodeReference, code: str, nonce: str):
    """One sandbox call: the judge, the solution, the tests on stdin."""
    from posttrain.sandbox import ExecRequest, Limits

    tests = json.loads(ref.tests_json)
    spec = {"nonce": nonce, "tests": tests, "mode": ref.mode, "timeout_s": ref.timeout_s}
    wall = ref.timeout_s * len(tests) + 10.0
    return ExecRequest(
        files={"harness.py": harness_source(), "solution.py": code},
        python_main="harness.py",
        stdin=json.dumps(spec).encode(),
        env={"HARNESS_TESTS": str(len(tests)), "HARNESS_ENTRY": ref.name, "HARNESS_KIND": ref.kind},
        limits=Limits(wall_s=wall, cpu_s=wall, memory_bytes=512 << 20, pids=len(tests) + 16, output_bytes=1 << 20),
    )


def parse_report(stdout: bytes, nonce: str) -> dict | None:
    """The judge's report: the last stdout line that is JSON with our nonce."""
    for line in reversed(stdout.decode("utf-8", "replace").splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict) and report.get("nonce") == nonce:
            return report
    return None


class CodeVerifier:
    """Pass rate of the hidden tests, run in the sandbox."""

    name = "code_tests"
    version = "1"

    def score(self, task: Task, episode: Episode) -> Score:
        from posttrain import sandbox

        ref: CodeReference = task.reference
        code = extract_code(episode.completion)
        if not code.strip():
            return Score(0.0, {"outcome": 0.0}, False, "no code")
        nonce = secrets.token_hex(16)
        result = sandbox.raise_for_infra(sandbox.run(build_request(ref, code, nonce), domain="code"))
        report = parse_report(result.stdout, nonce)
        if report is None:
            return Score(0.0, {"outcome": 0.0}, False, f"no judge report (sandbox status {result.status})")
        total = int(report["total"])
        passed = min(int(report["passed"]), total)
        value = passed / total if total else 0.0
        why = sorted({r["why"] for r in report["results"] if not r["ok"]})
        return Score(value, {"outcome": value}, passed == total, "; ".join(why)[:300])


class Code(Domain):
    name = "code"
    category = "code"
    description = "Python functions and classes judged by hidden unit tests in the sandbox; reward = pass rate"
    version = "1"
    levels = 3
    cost_class = "long"
    budget = Budget(turns=1, tokens=1024, seconds=60.0)
    verifier = CodeVerifier()

    def _pool(self, split: Split, difficulty: int) -> list[CodeTask]:
        return [t for t in load_tasks() if t.level == difficulty and split_of(self.name, t.prompt) == split]

    def sample(self, index: int, split: Split, difficulty: int) -> Task:
        self.check_difficulty(difficulty)
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        pool = self._pool(split, difficulty)
        if not pool:
            raise TaskError(f"code: no {split} task at difficulty {difficulty}")
        t = pool[index % len(pool)]
        ref = CodeReference(t.name, t.kind, t.mode, json.dumps(list(t.tests)), TEST_TIMEOUT_S[t.level])
        return Task(
            id=f"{self.name}:{split}:{difficulty}:{index}",
            domain=self.name,
            prompt=(Message("user", f"{t.prompt}\n{INSTRUCTION}"),),
            reference=ref,
            meta=TaskMeta(split=split, difficulty=difficulty, source=f"posttrain/code/{t.name}", taskset_version=self.taskset_version),
        )

    def _task(self, task: Task) -> CodeTask:
        name = task.reference.name
        for t in load_tasks():
            if t.name == name:
                return t
        raise TaskError(f"code: unknown task {name!r}")

    def gold(self, task: Task) -> str:
        return f"```python\n{self._task(task).solution}```"

    def wrong(self, task: Task) -> str:
        return f"```python\n{self._task(task).wrong}```"


register(Code())
