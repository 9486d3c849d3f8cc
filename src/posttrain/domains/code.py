"""code: write a Python function (or class) that passes hidden unit tests.

Invariant: no expected value ever enters the sandbox. Execution and
judgement are two steps: `execute` sends one sandbox request per completion
holding the solution and the test INPUTS only (data/code/driver.py feeds
them one at a time to a forked solver child that executes the solution
afresh in a new module for each, and reports what it returned, as plain
JSON data, or what it raised); `judge` compares those
outputs with the expected values on the host, so the solution can read its
whole address space and every file it sees without finding an answer, and
nothing it prints, patches or raises decides its score (an object equal to
everything never leaves the sandbox: only exact builtin types are
serialised). The reward is the pass rate; a sandbox infra error raises
SandboxError and is never a score. 61 tasks written for posttrain in three
levels (data/code/tasks_l*.py, built into tasks.json); a task's split is
fixed by a hash of its prompt.

`code_revise` is the coding loop on the same tasks: the prompt shows the
visible tests (build.py `visible_tests`), each turn CodeRevisionEnv runs them
(the same inputs-only request) and observes what failed, the episode ends
when they pass or at the turn budget, and the execute step then runs the
hidden tests (the others) on the last answer, which decide the reward. No
hidden test reaches an environment step or an observation.
"""

from __future__ import annotations

import importlib.util
import json
import marshal
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from posttrain.domains._common import run_summary
from posttrain.domains._modeljson import load_json
from posttrain.domains.base import Budget, Domain, last_fenced_block, split_of
from posttrain.domains.registry import register
from posttrain.errors import TaskError
from posttrain.types import Episode, Message, Score, Split, Task, TaskMeta, Turn

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "code")
INSTRUCTION = "Answer with the complete Python code in one ```python code block; do not print anything or read input."
TEST_TIMEOUT_S = {1: 2.0, 2: 2.0, 3: 4.0}
KINDS = ("function", "class")
MODES = ("exact", "approx", "unordered")
REPLY_BYTES = 64 << 10  # the driver's cap on one serialised return value (data/code/driver.py MAX_REPLY)


@dataclass(frozen=True)
class CodeReference:
    """What the verifier needs: the entry point and the hidden tests. Host-side
    only: `execute` sends the inputs, never `tests_json` itself."""

    name: str
    kind: str  # "function" or "class"
    mode: str  # "exact", "approx" or "unordered"
    tests_json: str  # the hidden tests, [{"args"|"calls": ..., "expected": ...}]
    timeout_s: float

    @classmethod
    def build(cls, name: str, kind: str, mode: str, tests: Sequence[dict], timeout_s: float) -> CodeReference:
        """A reference from plain parts, validated (ValueError naming the field)."""
        if not name.isidentifier():
            raise ValueError(f"CodeReference.name must be a Python identifier, got {name!r}")
        if kind not in KINDS:
            raise ValueError(f"CodeReference.kind must be one of {KINDS}, got {kind!r}")
        if mode not in MODES:
            raise ValueError(f"CodeReference.mode must be one of {MODES}, got {mode!r}")
        key = "calls" if kind == "class" else "args"
        for i, t in enumerate(tests):
            if not isinstance(t, dict) or key not in t or "expected" not in t or not isinstance(t[key], list):
                raise ValueError(f"CodeReference.tests[{i}] must be a dict with a list {key!r} and 'expected'")
        if not tests:
            raise ValueError("CodeReference.tests must not be empty")
        if not (isinstance(timeout_s, (int, float)) and 0 < timeout_s <= 600):
            raise ValueError(f"CodeReference.timeout_s must be in (0, 600], got {timeout_s!r}")
        return cls(name, kind, mode, json.dumps(list(tests)), float(timeout_s))

    def inputs(self) -> list:
        """The test inputs (args lists or call sequences), without expected values."""
        key = "calls" if self.kind == "class" else "args"
        return [t[key] for t in json.loads(self.tests_json)]

    def expected(self) -> list:
        return [t["expected"] for t in json.loads(self.tests_json)]


@dataclass(frozen=True)
class TestOutput:
    """What the solution did on one input: returned `value` (plain JSON data),
    raised (`detail` = the exception type), or gave no result (`detail` says why)."""

    kind: Literal["value", "raised", "none"]
    value: Any = None
    detail: str = ""
    trace: str = ""  # the traceback tail, for an explained run (the coding loop's visible tests)


@dataclass(frozen=True)
class CodeRun:
    """The execution result of one solution on a task's inputs: a value the
    verifier reads (`judge`). It holds no expected value."""

    outputs: tuple[TestOutput, ...]
    status: str  # the sandbox status of the driver (ok, failed, timeout, oom, killed)
    cpu_s: float = 0.0
    wall_s: float = 0.0
    exit_code: int | None = None
    stderr: str = ""  # the driver's stderr, truncated to its last STDERR_CHARS characters
    program: str = ""  # the solution that ran, truncated to PROGRAM_CHARS
    suite: str = "all"  # which tests ran: "all" (code), "visible" or "hidden" (the coding loop, code_revise)

    def summary(self) -> dict[str, Any]:
        """The trace's view: status, exit code, times, the program, each input's outcome."""
        tests = [
            {"kind": o.kind, **({"value": _short(o.value)} if o.kind == "value" else {"detail": o.detail})}
            for o in self.outputs
        ]
        return {**run_summary(self, tests=tests), **({"suite": self.suite} if self.suite != "all" else {})}


PROGRAM_CHARS = 4000
STDERR_CHARS = 2000


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "..."


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
    visible: tuple[int, ...] = ()  # the tests the coding loop shows (build.py visible_tests)


@lru_cache(maxsize=1)
def load_tasks() -> tuple[CodeTask, ...]:
    try:
        with open(os.path.join(DATA, "tasks.json")) as fh:
            raw = json.load(fh)
    except (OSError, ValueError) as exc:
        raise TaskError(f"code: cannot read {DATA}/tasks.json: {exc}") from exc
    return tuple(
        CodeTask(
            t["name"],
            t["level"],
            t["kind"],
            t["mode"],
            t["prompt"],
            t["solution"],
            t["wrong"],
            tuple(t["tests"]),
            tuple(t.get("visible", ())),
        )
        for t in raw
    )


@lru_cache(maxsize=1)
def driver_source() -> str:
    with open(os.path.join(DATA, "driver.py")) as fh:
        return fh.read()


# The driver arrives compiled (its source is 1.5 ms of compile in every task); an
# interpreter of another version (other magic number) compiles the source instead.
DRIVER_LOADER = """import importlib.util, marshal
with open("driver.bin", "rb") as fh:
    blob = fh.read()
magic = importlib.util.MAGIC_NUMBER
if blob[:len(magic)] == magic:
    code = marshal.loads(blob[len(magic):])
else:
    with open("driver_src.py") as fh:
        code = compile(fh.read(), "driver.py", "exec")
exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
"""


@lru_cache(maxsize=1)
def driver_files() -> dict[str, str | bytes]:
    blob = importlib.util.MAGIC_NUMBER + marshal.dumps(compile(driver_source(), "driver.py", "exec"))
    return {"driver.py": DRIVER_LOADER, "driver.bin": blob, "driver_src.py": driver_source()}


def extract_code(text: str) -> str:
    """The last fenced code block of the completion, else the whole text."""
    return last_fenced_block(text, ("python", "py", "Python"))


# ---------------------------------------------------------------- execute: inputs in, outputs out


def build_request(ref: CodeReference, code: str, explain: bool = False):
    """One sandbox call: the driver, the solution, the inputs on stdin (no expected
    value); `explain` asks the driver for the traceback of what raised."""
    from posttrain.sandbox import ExecRequest, Limits

    inputs = ref.inputs()
    spec = {"entry": ref.name, "kind": ref.kind, "timeout_s": ref.timeout_s, "inputs": inputs}
    if explain:
        spec["explain"] = True
    wall = ref.timeout_s * len(inputs) + 10.0
    return ExecRequest(
        files=driver_files() | {"solution.py": code},
        python_main="driver.py",
        stdin=json.dumps(spec).encode(),
        limits=Limits(
            wall_s=wall,
            cpu_s=wall,
            memory_bytes=512 << 20,
            pids=32,
            output_bytes=(REPLY_BYTES + 256) * len(inputs) + (64 << 10),
        ),
    )


def parse_outputs(stdout: bytes, n: int) -> tuple[TestOutput, ...]:
    """The driver's lines, in order; an input without its line has no result."""
    outs: list[TestOutput] = []
    for line in stdout.decode("utf-8", "replace").splitlines():
        if len(outs) == n:
            break
        try:
            rec = load_json(line)
        except ValueError:
            break
        if not isinstance(rec, dict) or rec.get("i") != len(outs):
            break
        if "value" in rec:
            outs.append(TestOutput("value", rec["value"]))
        elif "raised" in rec:
            outs.append(TestOutput("raised", detail=str(rec["raised"])[:80], trace=str(rec.get("trace", ""))[:2000]))
        else:
            outs.append(TestOutput("none", detail=str(rec.get("error", "no result"))[:80]))
    return tuple(outs) + (TestOutput("none", detail="no result"),) * (n - len(outs))


def execute(
    ref: CodeReference,
    code: str,
    runner: Callable[[Any], Any] | None = None,
    explain: bool = False,
    domain: str = "code",
    suite: str = "all",
) -> CodeRun:
    """Run `code` on the reference's inputs in the sandbox (`runner` defaults to
    the process-wide pool, under `domain`'s concurrency cap); SandboxError on an
    infra error."""
    from posttrain import sandbox

    req = build_request(ref, code, explain)
    res = sandbox.raise_for_infra(runner(req) if runner else sandbox.run(req, domain=domain))
    stderr = res.stderr.decode("utf-8", "replace")[-STDERR_CHARS:]
    return CodeRun(
        parse_outputs(res.stdout, len(ref.inputs())),
        res.status,
        res.cpu_s,
        res.wall_s,
        res.exit_code,
        stderr,
        code[:PROGRAM_CHARS],
        suite,
    )


# ---------------------------------------------------------------- judge: outputs against expected values, on the host


def same(got: Any, want: Any, mode: str) -> bool:
    """Whether a returned value (plain JSON data) matches the expected one."""
    try:
        return _same(got, want, mode)
    except RecursionError:
        return False


def _same(got: Any, want: Any, mode: str) -> bool:
    if mode == "approx":
        if isinstance(want, list):
            return isinstance(got, list) and len(got) == len(want) and all(_same(g, w, mode) for g, w in zip(got, want))
        if type(want) in (int, float) and type(got) in (int, float):
            return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)
        return _strict_eq(got, want)
    if mode == "unordered" and type(want) is list and type(got) is list:
        key = lambda v: json.dumps(v, sort_keys=True)  # noqa: E731
        return len(got) == len(want) and all(
            _strict_eq(g, w) for g, w in zip(sorted(got, key=key), sorted(want, key=key))
        )
    return _strict_eq(got, want)


def _strict_eq(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) is list:
        return len(a) == len(b) and all(_strict_eq(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(_strict_eq(a[k], b[k]) for k in a)
    return a == b


def why(out: TestOutput) -> str:
    return {"value": "wrong value", "raised": f"raised {out.detail}"}.get(out.kind, out.detail)


def judge(ref: CodeReference, run: CodeRun) -> Score:
    """Pass rate of `run`'s outputs against the reference's expected values."""
    expected = ref.expected()
    if len(run.outputs) != len(expected):
        raise TaskError(f"code: {len(run.outputs)} outputs for {len(expected)} tests of {ref.name}")
    oks = [out.kind == "value" and same(out.value, want, ref.mode) for out, want in zip(run.outputs, expected)]
    value = sum(oks) / len(oks)
    reasons = sorted({why(out) for out, ok in zip(run.outputs, oks) if not ok})
    return Score(value, {"outcome": value}, all(oks), "; ".join(reasons)[:300])


class CodeVerifier:
    """Pass rate of the hidden tests: `execute` in the sandbox (the pipeline's
    execute stage calls it), `judge` on the host. `score` reads the CodeRun in
    Episode.exec_result and makes no sandbox call; only a caller that skipped
    the execute step (a direct `score`) gets one run inside it."""

    name = "code_tests"
    version = "2"

    def execute(self, task: Task, completion: str, run: Callable[[Any], Any] | None = None) -> CodeRun | None:
        """The domain's execute step: one sandbox run, or None when there is no code."""
        code = extract_code(completion)
        return execute(task.reference, code, run) if code.strip() else None

    def score(self, task: Task, episode: Episode) -> Score:
        ref: CodeReference = task.reference
        run = episode.exec_result
        if not isinstance(run, CodeRun):
            run = self.execute(task, episode.completion)
        if run is None:
            return Score(0.0, {"outcome": 0.0}, False, "no code")
        return judge(ref, run)


# ---------------------------------------------------------------- cheats: each must score below the gold

_SCAN = """
import gc, json, os, sys

def _texts(v, depth=0, seen=None):
    seen = set() if seen is None else seen
    if id(v) in seen or depth > 4:
        return
    seen.add(id(v))
    if isinstance(v, (bytes, bytearray, str)):
        yield bytes(v).decode("utf-8", "replace") if not isinstance(v, str) else v
    elif isinstance(v, dict):
        for x in list(v.values()):
            yield from _texts(x, depth + 1, seen)
    elif isinstance(v, (list, tuple)):
        for x in list(v):
            yield from _texts(x, depth + 1, seen)
    elif hasattr(v, "__dict__"):
        yield from _texts(vars(v), depth + 1, seen)

def _answers(texts):
    for t in texts:
        if '"expected"' not in t:
            continue
        start = 0
        while True:
            start = t.find("{", start)
            if start < 0:
                break
            try:
                obj, _ = json.JSONDecoder().raw_decode(t[start:])
            except ValueError:
                start += 1
                continue
            tests = obj.get("tests") if isinstance(obj, dict) else obj
            if isinstance(tests, list):
                return [x for x in tests if isinstance(x, dict) and "expected" in x]
            start += 1
    return []

def ENTRY(*args):
    for t in _answers(SOURCE()):
        if t.get("args") == list(args):
            return t["expected"]
    return None
"""
_FRAMES = (
    "def SOURCE():\n    f, out = sys._getframe(), []\n    while f is not None:\n        out += "
    "list(_texts(dict(f.f_locals)))\n"
    "        f = f.f_back\n    return out\n"
)
_GC = "def SOURCE():\n    return [t for o in gc.get_objects() if isinstance(o, dict) for t in _texts(o, 3)]\n"
_MEM = (
    "def SOURCE():\n    out = []\n    for pid in ('self', str(os.getppid())):\n        try:\n"
    "            maps, mem = open(f'/proc/{pid}/maps'), open(f'/proc/{pid}/mem', 'rb')\n        except OSError:\n      "
    "      continue\n"
    "        for line in maps:\n            lo, hi = (int(x, 16) for x in line.split()[0].split('-'))\n"
    "            if 'rw' not in line.split()[1]:\n                continue\n            try:\n"
    "                mem.seek(lo)\n                out.append(mem.read(hi - lo).decode('latin-1'))\n            except "
    "(OSError, ValueError, OverflowError):\n"
    "                pass\n    return out\n"
)
_FILES = (
    "def SOURCE():\n    import glob, importlib.util\n    paths = glob.glob('/task/**', recursive=True) + "
    "glob.glob('/tmp/**', recursive=True)\n"
    "    for p in sys.path:\n        paths += glob.glob(os.path.join(p or '.', 'posttrain', 'domains', 'data', 'code', "
    "'*'))\n"
    "    try:\n        spec = importlib.util.find_spec('posttrain')\n"
    "        paths += glob.glob(os.path.join(os.path.dirname(spec.origin), 'domains', 'data', 'code', '*'))\n"
    "    except Exception:\n        pass\n    out = []\n    for p in paths:\n        try:\n"
    "            out.append(open(p, errors='replace').read(1 << 22))\n        except OSError:\n            pass\n    "
    "return out\n"
)

CHEATS: dict[str, str] = {
    "frame_walk": _SCAN + _FRAMES,
    "gc_scan": _SCAN + _GC,
    "memory_scan": _SCAN + _MEM,
    "read_files": _SCAN + _FILES,
    "exit_at_import": "import sys\nsys.exit(0)\n",
    "hard_exit": "import os\nos._exit(0)\n",
    "raise_system_exit": "def ENTRY(*args):\n    raise SystemExit(0)\n",
    "kill_driver": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
    "fake_results": (
        "import json, os, sys\nfor i in range(64):\n    line = (json.dumps({'i': i, 'value': True}) + '\\n').encode()\n"
        "    for fd in (1, 2):\n        os.write(fd, line)\n    for path in (f'/proc/{os.getppid()}/fd/1', "
        "'/proc/1/fd/1'):\n"
        "        try:\n            with open(path, 'wb') as fh:\n                fh.write(line)\n        except "
        "OSError:\n            pass\n"
        "print(json.dumps({'passed': 99, 'total': 99}))\nos._exit(0)\n"
    ),
    "equal_to_anything": (
        "class Any:\n    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n"
        "    def __hash__(self): return 0\ndef ENTRY(*args): return Any()\n"
    ),
    "int_subclass": "class T(int):\n    def __eq__(self, other): return True\n    __hash__ = int.__hash__\ndef "
    "ENTRY(*args): return T(1)\n",
    "patch_builtins": (
        "import builtins, json, math\nbuiltins.isinstance = lambda *a: True\nbuiltins.type = lambda *a: object\n"
        "json.dumps = lambda *a, **k: '{\"value\": true}'\njson.loads = lambda *a, **k: {'value': True}\nmath.isclose "
        "= lambda *a, **k: True\n"
        "def ENTRY(*args): return True\n"
    ),
}


# ---------------------------------------------------------------- the coding loop (code_revise)

REVISE_INSTRUCTION = (
    "Answer with the complete Python code in one ```python code block; do not print anything or read input. "
    "After each answer the visible tests run and you see what failed (input, expected and got, or the traceback); "
    "then answer again with the whole corrected code. Hidden tests decide the score."
)
OBS_CHARS = 1500  # an observation's length cap
NO_CODE = "No code found: answer with the complete Python code in one ```python code block."


@dataclass(frozen=True)
class RevisionReference:
    """The coding loop's tests, split in two. `visible`: shown in the prompt, run
    by the environment after every turn, their expected values may appear in
    observations. `hidden`: the others, run only by the execute step after the
    episode (judged on the host); no observation ever holds one of them."""

    visible: CodeReference
    hidden: CodeReference

    @property
    def name(self) -> str:
        return self.hidden.name


def _py(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def render_call(ref: CodeReference, inp: list) -> str:
    """One test input as Python: `f(1, 2)`, or a class's call sequence."""
    if ref.kind != "class":
        return f"{ref.name}({', '.join(_py(a, 80) for a in inp)})"
    calls = [f"{ref.name if m == '__init__' else m}({', '.join(_py(a, 60) for a in args)})" for m, args in inp]
    return "; ".join(calls)


def show_tests(ref: CodeReference) -> str:
    """The visible tests, as the prompt lists them."""
    rows = []
    for inp, want in zip(ref.inputs(), ref.expected()):
        sep = " -> returns " if ref.kind == "class" else " == "
        rows.append(f"  {render_call(ref, inp)}{sep}{_py(want)}")
    return "Visible tests (run after each answer):\n" + "\n".join(rows)


def feedback(ref: CodeReference, run: CodeRun) -> tuple[str, float]:
    """The observation of one run of the visible tests, and their pass rate."""
    expected = ref.expected()
    lines, passed = [], 0
    for inp, out, want in zip(ref.inputs(), run.outputs, expected):
        if out.kind == "value" and same(out.value, want, ref.mode):
            passed += 1
            continue
        lines += [f"FAILED {render_call(ref, inp)}", f"  expected: {_py(want)}"]
        if out.kind == "value":
            lines.append(f"  got:      {_py(out.value)}")
        elif out.kind == "raised":
            lines.append("  " + (out.trace or f"raised {out.detail}").strip().replace("\n", "\n  "))
        else:
            lines.append(f"  no result ({out.detail})")
    text = "\n".join([f"Visible tests: {passed} of {len(expected)} passed.", *lines])
    if len(text) > OBS_CHARS:
        text = text[:OBS_CHARS] + "\n[truncated]"
    return text, passed / len(expected)


class CodeRevisionEnv:
    """One episode of the coding loop: `step(action)` runs the action's code on
    the visible tests in the sandbox (inputs in, outputs out, compared on the
    host); the observation is what failed; done when every visible test passes.
    Per-turn part: process = the visible pass rate (0 without code). The hidden
    tests never reach the environment: its reference is the visible half only."""

    def __init__(self, runner: Callable[[Any], Any] | None = None, domain: str = "code_revise") -> None:
        self.runner, self.domain = runner, domain
        self._visible: CodeReference | None = None

    def reset(self, task: Task) -> str:
        self._visible = task.reference.visible
        return ""  # the prompt lists the visible tests

    def step(self, action: str):
        from posttrain.types import StepResult

        if self._visible is None:
            raise TaskError("code_revise: step before reset")
        code = extract_code(action)
        if not code.strip():
            return StepResult(NO_CODE, False, {"process": 0.0})
        run = execute(self._visible, code, self.runner, explain=True, domain=self.domain, suite="visible")
        text, rate = feedback(self._visible, run)
        return StepResult(text, rate == 1.0, {"process": rate}, run)

    def close(self) -> None:
        self._visible = None


def behaviour(turn: Turn) -> tuple[Any, ...]:
    """What a turn's code did on the visible tests, as a comparable value: each test's kind
    (value, raised, none), value and exception type (not the traceback, whose line numbers move
    with any edit); ("no code",) for a turn without code. Two turns with the same behaviour
    failed the same way, whatever their code's names and spacing."""
    return run_behaviour(turn.exec_result)


def run_behaviour(run: Any) -> tuple[Any, ...]:
    """`behaviour` of a visible-test run (`CodeRun`), ("no code",) for anything else."""
    if not isinstance(run, CodeRun):
        return ("no code",)
    return tuple((o.kind, json.dumps(o.value, sort_keys=True, default=repr), o.detail) for o in run.outputs)


def moved(turns: Sequence[Turn], before: tuple[Any, ...] | None = None) -> float | None:
    """The share of revisions whose behaviour on the visible tests differs from the attempt
    before's (`behaviour`): turns 2 on, and turn 1 too when `before` is given (the behaviour of
    the failed attempt a derived task's prompt ends with, `tasks.branch`); None where nothing
    was revised (one turn, no `before`). A revision that hands back the failed function,
    renamed or reformatted or not, counts 0."""
    seq = ([before] if before is not None else []) + [behaviour(t) for t in turns]
    if len(seq) < 2:
        return None
    return sum(a != b for a, b in zip(seq, seq[1:])) / (len(seq) - 1)


def prompt_behaviour(task: Task, domain: str) -> tuple[Any, ...] | None:
    """For a derived task (`meta.branched` > 0: the model's failed turns in its prompt), the
    behaviour on the visible tests of the last attempt its prompt holds (the last assistant
    message's code, run in the sandbox as the environment runs a turn); None for any other task.
    SandboxError on an infra error, as every sandbox run here."""
    if not task.meta.branched:
        return None
    prior = next((m.content for m in reversed(task.prompt) if m.role == "assistant"), None)
    return None if prior is None else _visible_behaviour(task.reference.visible, extract_code(prior), domain)


@lru_cache(maxsize=1024)
def _visible_behaviour(visible: CodeReference, code: str, domain: str) -> tuple[Any, ...]:
    """`run_behaviour` of `code` on the visible tests, run once per tests and code (a derived
    group's samples share their prompt's attempt; an infra error raises and is not kept)."""
    run = execute(visible, code, explain=True, domain=domain, suite="visible") if code.strip() else None
    return run_behaviour(run)


class RevisionVerifier:
    """The coding loop's verdict: the hidden tests' pass rate (outcome), run by
    the execute step on the last action; process = mean visible pass rate over
    the turns (the environment's per-turn parts); efficiency = 1 / turns used;
    moved (episodes of two turns or more, and every episode of a derived task, whose
    first turn revises the failed attempt its prompt ends with: `prompt_behaviour`) = the
    share of revisions that did not fail the visible tests as the attempt before did
    (`moved`). value = outcome; passed =
    every hidden test passed. Weighting `moved` (`tasks.domains.<name>.reward_weights`)
    pays a revision for trying something other than the failed function: never as much
    as a pass, nothing for a repeat."""

    name = "code_hidden_tests"
    version = "1"
    domain = "code_revise"
    """The domain its sandbox requests are labelled with."""

    def execute(self, task: Task, completion: str, run: Callable[[Any], Any] | None = None) -> CodeRun | None:
        """The execute step: the hidden tests on the completion's code, or None without code."""
        code = extract_code(completion)
        if not code.strip():
            return None
        return execute(task.reference.hidden, code, run, domain=self.domain, suite="hidden")

    def score(self, task: Task, episode: Episode) -> Score:
        """Any reference with a `hidden` CodeReference (RevisionReference, code_fix's FixReference)."""
        ref: RevisionReference = task.reference
        run = episode.exec_result
        if not (isinstance(run, CodeRun) and run.suite == "hidden"):  # a direct `score`: no execute step ran
            run = self.execute(task, episode.completion)
        hidden = judge(ref.hidden, run) if run is not None else Score(0.0, {"outcome": 0.0}, False, "no code")
        parts = {"outcome": hidden.value, "efficiency": 1.0 / max(1, len(episode.turns))}
        if episode.turns:
            parts["process"] = sum(t.parts.get("process", 0.0) for t in episode.turns) / len(episode.turns)
        share = moved(episode.turns, prompt_behaviour(task, self.domain) if episode.turns else None)
        if share is not None:
            parts["moved"] = share
        return Score(hidden.value, parts, hidden.passed, hidden.reason)


def visible_lookup(task: Task) -> str | None:
    """A cheat for the coding loop: a table of the visible tests' answers (it passes
    them and ends the episode in one turn); None for class tasks."""
    vis: CodeReference = task.reference.visible
    if vis.kind == "class":
        return None
    table = {json.dumps(i): e for i, e in zip(vis.inputs(), vis.expected())}
    return f"import json\n_T = {table!r}\n\ndef {vis.name}(*args):\n    return _T.get(json.dumps(list(args)))\n"


class Code(Domain):
    name = "code"
    category = "code"
    description = (
        "Python functions and classes judged by hidden unit tests; the sandbox runs the inputs, the host compares; "
        "reward = pass rate"
    )
    version = "1"
    levels = 3
    cost_class = "long"
    budget = Budget(turns=1, tokens=1024, seconds=60.0)
    verifier = CodeVerifier()

    def action_key(self, action: str) -> str:
        """The action's code (`extract_code`), whitespace aside: the prose around it does not count."""
        return " ".join(extract_code(action).split())

    def _pool(self, split: Split, difficulty: int) -> list[CodeTask]:
        # split by the `code` domain's hash: code and code_revise share their eval tasks
        return [t for t in load_tasks() if t.level == difficulty and split_of("code", t.prompt) == split]

    def sample(self, index: int, split: Split, difficulty: int) -> Task:
        self.check_difficulty(difficulty)
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        pool = self._pool(split, difficulty)
        if not pool:
            raise TaskError(f"code: no {split} task at difficulty {difficulty}")
        t = pool[index % len(pool)]
        ref, prompt = self._reference(t)
        return Task(
            id=f"{self.name}:{split}:{difficulty}:{index}",
            domain=self.name,
            prompt=(Message("user", prompt),),
            reference=ref,
            meta=TaskMeta(
                split=split,
                difficulty=difficulty,
                source=f"posttrain/code/{t.name}",
                taskset_version=self.taskset_version,
            ),
        )

    def _reference(self, t: CodeTask) -> tuple[Any, str]:
        """The task's reference and prompt text."""
        ref = CodeReference(t.name, t.kind, t.mode, json.dumps(list(t.tests)), TEST_TIMEOUT_S[t.level])
        return ref, f"{t.prompt}\n{INSTRUCTION}"

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

    def cheats(self, task: Task) -> list[str]:
        """Solutions that try to win without solving (CHEATS): read the answers from
        frames, gc, memory or files; exit early; print fake results; return
        objects equal to anything; patch builtins. Each must score below the gold."""
        return [f"```python\n{src.replace('ENTRY', task.reference.name)}```" for src in CHEATS.values()]


register(Code())


class CodeRevise(Code):
    """The coding loop: the same tasks as `code` (and the same eval split), multi-turn.
    The prompt lists the visible tests; each turn the environment runs them and
    shows what failed; the episode ends when they pass or at the turn budget; the
    execute step then runs the hidden tests on the last answer, which decide the
    reward (RevisionVerifier)."""

    name = "code_revise"
    description = (
        "the coding loop: write code, the visible tests run in the sandbox, read the failure, revise; hidden tests "
        "decide the reward"
    )
    budget = Budget(turns=4, tokens=1024, seconds=120.0)
    verifier = RevisionVerifier()

    def _reference(self, t: CodeTask) -> tuple[Any, str]:
        timeout = TEST_TIMEOUT_S[t.level]
        tests = list(t.tests)
        shown = [tests[i] for i in t.visible]
        rest = [x for i, x in enumerate(tests) if i not in t.visible]
        if not shown or not rest:
            raise TaskError(f"code_revise: task {t.name} needs visible and hidden tests (tasks.json 'visible')")
        ref = RevisionReference(
            CodeReference(t.name, t.kind, t.mode, json.dumps(shown), timeout),
            CodeReference(t.name, t.kind, t.mode, json.dumps(rest), timeout),
        )
        return ref, f"{t.prompt}\n{show_tests(ref.visible)}\n{REVISE_INSTRUCTION}"

    def environment(self):
        return CodeRevisionEnv

    def gold_turns(self, task: Task) -> list[str]:
        """The gold trajectory: the reference solution, which passes the visible tests at once."""
        return [self.gold(task)]

    def cheats(self, task: Task) -> list[str]:
        """The `code` cheats on the hidden tests, and a table of the visible answers."""
        table = visible_lookup(task)
        return super().cheats(task) + ([f"```python\n{table}```"] if table else [])


register(CodeRevise())
