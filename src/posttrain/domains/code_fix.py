"""code_fix: the coding family's learnable tier: a stale spec, a failing visible test, a fix.

The prompt states a one-line spec, `spec:abc(x)=x+34`; the hidden truth is
`abc(x)=x+K`, with K equal to the spec's constant on about a third of the tasks
(STALE_SHARE of them have another two-digit K). The model answers with one line
of Python, `def abc(x):return x+34`. Each turn the environment runs ONE visible
test in the sandbox (the family's inputs-only request, `code.execute`, judged on
the host): `abc(0)` at level 1 (`x+K`), `abc(1)` at level 2 (`x*K`), and observes
`abc(0)=34,want:27` (what the code returned and what the test wants), or what it
raised (`abc(0):NameError,want:27`); the episode ends when the visible test passes
or at the turn budget. So the gold first attempt follows the spec, and on a stale
task only the observation tells the right constant; the gold revision uses it.

Invariant: the reward is the family's own: the hidden tests (three other inputs,
drawn per task) run by the execute step on the last answer (RevisionVerifier's
pattern: `execute` in the sandbox with inputs only, `judge` on the host), never a
match on an observation's text. No hidden input or expected value reaches an
environment step or an observation. Hard-coding the value the visible test wants,
a table or a special case of the visible input, copying the observation and
stopping all pass at most the visible test, so they score 0 on the hidden ones;
the `code` family's CHEATS keep scoring 0 too. Reward = hidden pass rate (value =
outcome, passed = every hidden test passed; a retry that gets there passes at the
same value); parts: outcome, process (visible pass rate over the turns),
efficiency (1 / turns used). One completion holding the actions one per line runs
as one program: the last `def` is the answer, the same as the episode's last
action. Text is whitespace-sparse (two spaces in an answer) for the tiny model.
"""

from __future__ import annotations

import json
import keyword
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.domains.base import Budget, ProceduralDomain
from posttrain.domains.code import CHEATS, CodeReference, CodeRun, RevisionVerifier, execute, extract_code, same
from posttrain.domains.registry import register
from posttrain.errors import TaskError
from posttrain.types import Task

STALE_SHARE = 2 / 3
"""Share of tasks whose spec constant is stale (the hidden K differs)."""
OPS = {1: "+", 2: "*"}
"""The spec's operation at each level."""
VISIBLE_INPUT = {"+": 0, "*": 1}
"""The visible test's input: the one where the returned value names K (x+K at 0, x*K at 1)."""
K_RANGE = (10, 99)
HIDDEN_TESTS = 3
TIMEOUT_S = 2.0
OBS_CHARS = 30
NO_CODE = "no_code"


@dataclass(frozen=True)
class FixReference:
    """The task's tests, split in two (`code_revise`'s RevisionReference, plus what the
    gold and the buggy policy need): `visible` (one test, run by the environment every
    turn; its expected value may appear in an observation), `hidden` (run only by the
    execute step after the episode, judged on the host), the spec's constant `spec`,
    the true `k` and the operation `op`."""

    visible: CodeReference
    hidden: CodeReference
    op: str
    spec: int
    k: int

    @property
    def name(self) -> str:
        return self.hidden.name

    @property
    def stale(self) -> bool:
        return self.spec != self.k


def apply(op: str, x: int, k: int) -> int:
    return x + k if op == "+" else x * k


def answer(name: str, op: str, k: int) -> str:
    """The one-line answer `def abc(x):return x+k`."""
    return f"def {name}(x):return x{op}{k}"


def _name(rng: random.Random) -> str:
    while True:
        name = "".join(rng.choices(string.ascii_lowercase, k=3))
        if not keyword.iskeyword(name) and name not in ("def",):
            return name


def _short(value: Any, limit: int = 8) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "~"


def observe(ref: CodeReference, run: CodeRun) -> tuple[str, bool]:
    """The compact observation of the one visible test, and whether it passed:
    `abc(0)=34,want:27`, `abc(0):NameError,want:27`, or `pass`."""
    (inp,), (want,), (out,) = ref.inputs(), ref.expected(), run.outputs
    call = f"{ref.name}({inp[0]})"
    if out.kind == "value" and same(out.value, want, ref.mode):
        return "pass", True
    if out.kind == "value":
        text = f"{call}={_short(out.value)},want:{want}"
    else:
        what = out.detail if out.kind == "raised" else "no_result"
        text = f"{call}:{what.split(':')[0][:14]},want:{want}"
    return text[:OBS_CHARS], False


class CodeFixEnv:
    """One episode: `step(action)` runs the action's code on the visible test in the
    sandbox (`code.execute`, inputs only) and observes the outcome; done when it
    passes. Per-turn part: process = the visible pass (0 without code). The hidden
    tests never reach the environment: it holds the visible half only."""

    def __init__(self, runner: Callable[[Any], Any] | None = None, domain: str = "code_fix") -> None:
        self.runner, self.domain = runner, domain
        self._visible: CodeReference | None = None

    def reset(self, task: Task) -> str:
        self._visible = task.reference.visible
        return ""  # the prompt holds the spec

    def step(self, action: str):
        from posttrain.types import StepResult

        if self._visible is None:
            raise TaskError("code_fix: step before reset")
        code = extract_code(action)
        if not code.strip():
            return StepResult(NO_CODE, False, {"process": 0.0})
        run = execute(self._visible, code, self.runner, domain=self.domain, suite="visible")
        text, ok = observe(self._visible, run)
        return StepResult(text, ok, {"process": float(ok)}, run)

    def close(self) -> None:
        self._visible = None


class CodeFixVerifier(RevisionVerifier):
    """The coding loop's verdict (`RevisionVerifier`): the hidden tests' pass rate on the last
    answer (outcome), run by the execute step; process = mean visible pass over the turns;
    efficiency = 1 / turns used. value = outcome; passed = every hidden test passed."""

    name = "code_fix_hidden_tests"
    version = "1"
    domain = "code_fix"


def miscopy(k: int) -> int:
    """K copied wrongly: its digits reversed, or (a palindrome, or a reversal with a
    leading zero) K + 1."""
    flipped = int(str(k)[::-1])
    return flipped if flipped != k and len(str(flipped)) == len(str(k)) else k + 1


class CodeFix(ProceduralDomain):
    name = "code_fix"
    category = "code"
    description = (
        "the coding loop's learnable tier: a stale one-line spec, one visible test names the wanted value, "
        "fix the constant; hidden tests decide the reward"
    )
    levels = 2
    cost_class = "short"
    partial_credit = True
    budget = Budget(turns=3, tokens=32, seconds=60.0)
    verifier = CodeFixVerifier()
    pretrain_pool = 512
    """Distinct train transcripts a base build plays through the sandbox and reuses
    (`Domain.pretrain_pool`; each env step is one sandbox run, about 20 ms warm)."""

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, Any]:  # type: ignore[override]
        op = OPS[difficulty]
        name = _name(rng)
        spec = rng.randint(*K_RANGE)
        k = spec
        if rng.random() < STALE_SHARE:
            while k == spec:
                k = rng.randint(*K_RANGE)
        x0 = VISIBLE_INPUT[op]
        xs = rng.sample([x for x in range(2, 100) if x != x0], HIDDEN_TESTS)
        visible = CodeReference.build(
            name, "function", "exact", [{"args": [x0], "expected": apply(op, x0, k)}], TIMEOUT_S
        )
        hidden = CodeReference.build(
            name, "function", "exact", [{"args": [x], "expected": apply(op, x, k)} for x in xs], TIMEOUT_S
        )
        return f"spec:{name}(x)=x{op}{spec}", FixReference(visible, hidden, op, spec, k)

    def environment(self) -> type[CodeFixEnv]:
        return CodeFixEnv

    def gold_turns(self, task: Task) -> list[str]:
        """The gold trajectory: the spec's code; on a stale task, the code with the K the
        visible test's message implies (want - x0 for +, want / x0 for *: x0 is 0 or 1)."""
        ref: FixReference = task.reference
        first = answer(ref.name, ref.op, ref.spec)
        return [first] if not ref.stale else [first, answer(ref.name, ref.op, ref.k)]

    def gold(self, task: Task) -> str:
        return "\n".join(self.gold_turns(task))

    def wrong(self, task: Task) -> str:
        """The spec's code, then (on a stale task) K miscopied from the message; on a task
        whose spec is right, the miscopied K at once."""
        ref: FixReference = task.reference
        bad = answer(ref.name, ref.op, miscopy(ref.k))
        return f"{answer(ref.name, ref.op, ref.spec)}\n{bad}" if ref.stale else bad

    def cheats(self, task: Task) -> list[str]:
        """Completions that try for reward without solving: the visible test's wanted value
        hard-coded, a table of the visible input, the observation copied, stopping (`done`,
        nothing); on a stale task also a special case of the visible input over the spec, and
        each of these after the spec's failing attempt (the spec resubmitted too); and the
        `code` family's CHEATS (read the answers from frames, gc, memory or files; exit early;
        fake results; objects equal to anything; patched builtins). Each scores below the gold."""
        ref: FixReference = task.reference
        (x0,), want = ref.visible.inputs()[0], ref.visible.expected()[0]
        n, spec = ref.name, answer(ref.name, ref.op, ref.spec)
        out = [
            f"def {n}(x):return {want}",
            f"def {n}(x):return {{{x0}:{want}}}[x]",
            f"{n}({x0})={apply(ref.op, x0, ref.spec)},want:{want}",
            "done",
            "",
        ]
        if ref.stale:  # a special case of the visible input over the spec; the cheats after the spec's
            # failing attempt (on a right spec, that attempt is the gold)
            out.append(f"def {n}(x):return {want} if x=={x0} else x{ref.op}{ref.spec}")
            copied = f"{n}({x0})={apply(ref.op, x0, ref.spec)},want:{want}"
            out += [f"{spec}\n{x}" for x in (f"def {n}(x):return {want}", copied, spec, "done")]
        return out + [f"```python\n{src.replace('ENTRY', n)}```" for src in CHEATS.values()]


register(CodeFix())
