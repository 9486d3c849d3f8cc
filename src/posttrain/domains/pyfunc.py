"""pyfunc and pyfunc_revise: short Python functions for a real small instruct model (issue 37).

Tasks are drawn from a table of one-to-three-line functions stated in plain English
("Write a Python function `add_7(x)` that returns x plus 7."), with constants and names
drawn per task, in three levels: arithmetic on one number (level 1), one pass over a
string or a list (level 2), a loop with a condition or two arguments (level 3). The
expected values are computed on the host by the table's own reference function; the
solution the model writes runs in the sandbox through the `code` family's machinery
(`code.execute`: inputs only into the sandbox, outputs judged on the host), so the code
family's invariants and cheats hold here too.

`pyfunc` is single-turn: hidden tests decide the reward (`code.CodeVerifier`'s pass rate).
`pyfunc_revise` is the coding feedback loop on the same tasks: the prompt shows two
visible tests; each turn `code.CodeRevisionEnv` runs them in the sandbox and observes
what failed (input, expected and got, or the traceback); the model revises; the episode
ends when they pass or at the turn budget; the execute step then runs the hidden tests
(the others) on the last answer (`code.RevisionVerifier`). No hidden test reaches an
observation.
`pyfunc_fix` is that loop entered at its second turn: the prompt holds the request, a first
attempt (the template's plausible wrong body) as the assistant's turn, and what the visible
tests observed of it, exactly as `pyfunc_revise`'s environment words a failure; the model's
own first turn is a revision, and the loop goes on from there. It trains the revision that
`pyfunc_revise` measures as pass@turn-2 over pass@turn-1, from a failure that is always there.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from posttrain.domains.base import Budget, ProceduralDomain, split_of, stable_rng
from posttrain.domains.code import (
    CHEATS,
    Code,
    CodeReference,
    CodeRevisionEnv,
    CodeRun,
    CodeVerifier,
    RevisionReference,
    RevisionVerifier,
    TestOutput,
    feedback,
    show_tests,
    visible_lookup,
)
from posttrain.domains.registry import register
from posttrain.errors import TaskError
from posttrain.types import Message, Split, Task, Turn

INSTRUCTION = "Answer with the complete Python function in one ```python code block; do not print anything."
REVISE_INSTRUCTION = (
    "Answer with the complete Python function in one ```python code block; do not print anything. "
    "After each answer the visible tests run and you see what failed; then answer again with the corrected function."
)
TIMEOUT_S = 2.0
N_TESTS = 6
VISIBLE = 2


@dataclass(frozen=True)
class Template:
    """One kind of function: its name stem, its English statement, its body (all three with
    `{k}` for the drawn constant), a plausible wrong body, and its test inputs."""

    stem: str
    text: str
    body: str
    bad: str
    args: str  # the parameter list
    inputs: Callable[[random.Random, int], list]  # one test's arguments, given the constant
    level: int


def _ints(rng: random.Random, k: int) -> list:
    return [rng.randint(-20, 50)]


def _words(rng: random.Random, k: int) -> list:
    pool = ["apple", "sky", "banana", "kiwi", "tree", "orange", "plum", "grape", "melon", "pear"]
    return [" ".join(rng.sample(pool, rng.randint(1, 4)))]


def _list(rng: random.Random, k: int) -> list:
    xs = [rng.randint(-9, 30) for _ in range(rng.randint(1, 6))]
    return [xs + [k] if rng.random() < 0.3 else xs]  # the constant itself, now and then: a boundary


def _two(rng: random.Random, k: int) -> list:
    return [rng.randint(-9, 30), rng.randint(-9, 30)]


def _nat(rng: random.Random, k: int) -> list:
    return [rng.randint(0, 12)]


TEMPLATES = (
    Template("add", "returns x plus {k}", "return x + {k}", "return x - {k}", "x", _ints, 1),
    Template("times", "returns x multiplied by {k}", "return x * {k}", "return x + {k}", "x", _ints, 1),
    Template("square_plus", "returns x squared plus {k}", "return x * x + {k}", "return x * 2 + {k}", "x", _ints, 1),
    Template("is_multiple", "returns True if x is divisible by {k}, else False", "return x % {k} == 0",
             "return x % {k} == 1", "x", _ints, 1),
    Template("count_vowels", "returns the number of vowels (a, e, i, o, u) in the string s",
             "return sum(1 for c in s if c in 'aeiou')", "return len(s)", "s", _words, 2),
    Template("reverse_words", "returns the string s with its words in reverse order, separated by single spaces",
             "return ' '.join(s.split()[::-1])", "return s[::-1]", "s", _words, 2),
    Template("largest", "returns the largest number in the non-empty list xs", "return max(xs)", "return xs[-1]",
             "xs", _list, 2),
    Template("count_above", "returns how many numbers in the list xs are greater than {k}",
             "return sum(1 for v in xs if v > {k})", "return sum(1 for v in xs if v >= {k})", "xs", _list, 2),
    Template("sum_even", "returns the sum of the even numbers in the list xs",
             "return sum(v for v in xs if v % 2 == 0)", "return sum(xs)", "xs", _list, 3),
    Template("clamp_sum", "returns a + b, but never more than {k}", "return min(a + b, {k})", "return a + b",
             "a, b", _two, 3),
    Template("factorial", "returns n factorial (1 for n = 0)",
             "r = 1\n    for i in range(2, n + 1):\n        r *= i\n    return r",
             "r = 0\n    for i in range(1, n + 1):\n        r *= i\n    return r", "n", _nat, 3),
    Template("triangular", "returns 1 + 2 + ... + n (0 for n = 0)", "return n * (n + 1) // 2", "return n * n // 2",
             "n", _nat, 3),
)  # fmt: skip


def source(t: Template, name: str, k: int, bad: bool = False) -> str:
    return f"def {name}({t.args}):\n    {(t.bad if bad else t.body).format(k=k)}\n"


def reference_function(t: Template, k: int, bad: bool = False) -> Callable[..., Any]:
    """The template's own body (or its wrong one) as a host function: posttrain's code, never the model's."""
    scope: dict[str, Any] = {}
    exec(source(t, "f", k, bad), scope)  # noqa: S102 - the table's own reference bodies
    return scope["f"]


def draw(rng: random.Random, difficulty: int) -> tuple[int, int, list[dict]]:
    """A template of the level (its index), a constant and N_TESTS distinct tests, the first
    visible one and the first hidden one each telling the template's wrong body apart (so the
    wrong answer fails both suites, and the loop's first failure is informative)."""
    pool = [i for i, t in enumerate(TEMPLATES) if t.level == difficulty]
    idx = rng.choice(pool)
    t = TEMPLATES[idx]
    k = rng.randint(2, 30)
    good, bad = reference_function(t, k), reference_function(t, k, bad=True)
    seen: list = []
    differ: list = []
    for _ in range(500):
        args = t.inputs(rng, k)
        if args not in seen:
            seen.append(args)
            if good(*args) != bad(*args):
                differ.append(args)
        if len(seen) >= N_TESTS + 2 and len(differ) >= 2:
            break
    if len(differ) < 2 or len(seen) < N_TESTS:
        raise TaskError(f"pyfunc: {t.stem} (k={k}): too few distinct tests that tell its wrong body apart")
    rest = [a for a in seen if a not in differ[:2]][: N_TESTS - 2]
    order = [differ[0], *rest[: VISIBLE - 1], differ[1], *rest[VISIBLE - 1 :]]
    return idx, k, [{"args": a, "expected": good(*a)} for a in order]


def name_of(t: Template, k: int) -> str:
    """The function's name: the stem, with the constant when the statement has one (`add_7`)."""
    return f"{t.stem}_{k}" if "{k}" in t.text else t.stem


def parse_name(name: str) -> tuple[Template, int]:
    """The template and constant a function name was built from (the stems are distinct)."""
    for t in TEMPLATES:
        if name == t.stem:
            return t, 0
        if name.startswith(t.stem + "_") and name[len(t.stem) + 1 :].isdigit() and "{k}" in t.text:
            return t, int(name[len(t.stem) + 1 :])
    raise TaskError(f"pyfunc: unknown function name {name!r}")


def statement(t: Template, k: int) -> str:
    return f"Write a Python function `{name_of(t, k)}({t.args})` that {t.text.format(k=k)}."


def _split_key(question: str) -> str:
    """What decides a task's split: the statement (its first line), so a function's tasks (in
    pyfunc and pyfunc_revise alike, whatever their tests) are all held out or all trained on."""
    return question.split("\n", 1)[0]


class PyFunc(ProceduralDomain):
    name = "pyfunc"
    category = "code"
    description = "short Python functions stated in English, checked by hidden tests in the sandbox; 3 levels"
    levels = 3
    cost_class = "short"
    partial_credit = True
    budget = Budget(turns=1, tokens=160, seconds=60.0)
    verifier: Any = CodeVerifier()
    draws_as: str | None = None
    """The name whose draws this domain's tasks repeat (None: its own): a control family that asks
    the same questions as another (`pyfunc_retry` those of `pyfunc_revise`), item for item."""

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, Any]:  # type: ignore[override]
        idx, k, tests = draw(rng, difficulty)
        t = TEMPLATES[idx]
        ref = CodeReference.build(name_of(t, k), "function", "exact", tests, TIMEOUT_S)
        return f"{statement(t, k)}\n{INSTRUCTION}", ref

    def sample(self, index: int, split: Split, difficulty: int) -> Task:
        """ProceduralDomain's draw (seeded by `draws_as` where set), the split decided by the statement
        alone (`_split_key`, under pyfunc's name), so pyfunc and pyfunc_revise hold out the same functions."""
        self.check_difficulty(difficulty)
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        for attempt in range(10_000):
            rng = stable_rng(self.draws_as or self.name, self.version, difficulty, split, index, attempt)
            question, ref = self.generate(rng, difficulty)
            if split_of("pyfunc", _split_key(question)) == split:
                return self.make_task(index, split, difficulty, question, ref)
        raise TaskError(f"{self.name}: no {split} task found at difficulty {difficulty}")

    def _code(self, task: Task, bad: bool = False) -> str:
        t, k = parse_name(task.reference.name)
        return f"```python\n{source(t, task.reference.name, k, bad)}```"

    def gold(self, task: Task) -> str:
        return self._code(task)

    action_key = Code.action_key  # the code family's: its code, whitespace aside, not the prose around it

    def wrong(self, task: Task) -> str:
        return self._code(task, bad=True)

    def cheats(self, task: Task) -> Sequence[str]:
        """The code family's CHEATS (read the answers from frames, gc, memory or files; exit
        early; fake results; objects equal to anything; patched builtins), no code, and the
        statement echoed."""
        n = task.reference.name
        return ["", task.prompt[-1].content] + [f"```python\n{src.replace('ENTRY', n)}```" for src in CHEATS.values()]


register(PyFunc())


ASK_REVISION = "The function above is wrong. Write a corrected function that passes these tests."
"""The line that closes the loop's observation of a failed attempt. Measured on
SmolLM2-135M-Instruct (docs/models.md): without it the model mostly repeats its failed
function; with it, sampled revisions of a planted level-1 failure passed 6 of 64 times, not 1."""


def ask_revision(observation: str) -> str:
    """The observation of a failed attempt, closed by `ASK_REVISION` (the one home of that wording:
    the environment's observations and pyfunc_fix's planted one)."""
    return f"{observation}\n{ASK_REVISION}"


class PyFuncReviseEnv(CodeRevisionEnv):
    """`code.CodeRevisionEnv`, its sandbox requests labelled pyfunc_revise, a failure's observation
    (what `shown` keeps of it: here all) closed by `ASK_REVISION`."""

    def __init__(self, runner: Callable[[Any], Any] | None = None, domain: str = "pyfunc_revise") -> None:
        super().__init__(runner, domain)

    def shown(self, observation: str) -> str:
        """What the model is shown of a failure's observation (a subclass may withhold part of it)."""
        return observation

    def step(self, action: str):
        result = super().step(action)
        return result if result.done else replace(result, observation=ask_revision(self.shown(result.observation)))


class PyFuncReviseVerifier(RevisionVerifier):
    """`code.RevisionVerifier` (the hidden tests' pass rate on the last answer), labelled for pyfunc_revise."""

    name = "pyfunc_hidden_tests"
    version = "1"
    domain = "pyfunc_revise"


class PyFuncRevise(PyFunc):
    """The coding feedback loop on pyfunc's tasks (`code.CodeRevisionEnv`, `code.RevisionVerifier`)."""

    name = "pyfunc_revise"
    description = (
        "the coding feedback loop on pyfunc: write a function, the visible tests run in the sandbox, read the "
        "failure, revise; hidden tests decide the reward"
    )
    budget = Budget(turns=3, tokens=160, seconds=120.0)
    verifier = PyFuncReviseVerifier()

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, Any]:  # type: ignore[override]
        idx, k, tests = draw(rng, difficulty)
        t, name = TEMPLATES[idx], name_of(TEMPLATES[idx], k)
        mk = lambda ts: CodeReference.build(name, "function", "exact", ts, TIMEOUT_S)  # noqa: E731
        ref = RevisionReference(mk(tests[:VISIBLE]), mk(tests[VISIBLE:]))
        return f"{statement(t, k)}\n{show_tests(ref.visible)}\n{REVISE_INSTRUCTION}", ref

    def environment(self) -> type[CodeRevisionEnv]:
        return PyFuncReviseEnv

    def gold_turns(self, task: Task) -> list[str]:
        """The gold trajectory: the reference function, which passes the visible tests at once."""
        return [self.gold(task)]

    def cheats(self, task: Task) -> Sequence[str]:
        """pyfunc's cheats on the hidden tests, a table of the visible answers, and every attempt
        the prompt already holds (a derived task's failed turns, `branched`) handed back unchanged."""
        table = visible_lookup(task)
        own = [m.content for m in task.prompt if m.role == "assistant"]
        return [*super().cheats(task), *([f"```python\n{table}```"] if table else []), *own]

    def branch_at(self, task: Task, turns: Sequence[Turn]) -> int:
        """1 when the episode's first turn is a failure the model revised from (the visible tests
        failed, or its answer had no code: process below 1) and is not its last turn: the derived
        task is this loop entered at its second turn from the model's own first attempt (what
        `pyfunc_fix` plants). 0 otherwise (a first turn that passed the visible tests, or the only
        turn: truncated, or the turn budget spent)."""
        first = turns[0] if turns else None
        return int(first is not None and len(turns) > 1 and first.parts.get("process", 0.0) < 1.0)


register(PyFuncRevise())


def count_line(observation: str) -> str:
    """What `pyfunc_retry` keeps of a failure's observation: its first line, the visible tests'
    count ("Visible tests: 1 of 3 passed."; `code.feedback` opens with it), or `NO_CODE` whole."""
    return observation.split("\n", 1)[0]


class PyFuncRetryEnv(PyFuncReviseEnv):
    """`PyFuncReviseEnv` with the failure's text withheld: a failed attempt's observation is the visible
    tests' count alone, closed by `ASK_REVISION`; which test failed, what it returned or raised, is not
    shown. The sandbox runs the same tests; the per-turn parts are pyfunc_revise's."""

    def __init__(self, runner: Callable[[Any], Any] | None = None, domain: str = "pyfunc_retry") -> None:
        super().__init__(runner, domain)

    def shown(self, observation: str) -> str:
        return count_line(observation)


class PyFuncRetryVerifier(PyFuncReviseVerifier):
    """The hidden tests' pass rate on the last answer, labelled for pyfunc_retry."""

    domain = "pyfunc_retry"


class PyFuncRetry(PyFuncRevise):
    """The control for reading the failure: `pyfunc_revise`'s tasks, item for item (`draws_as`), told only
    how many visible tests failed (`PyFuncRetryEnv`). A revision that reads the failure converts more of
    its failed first turns in `pyfunc_revise` than here; one that merely tries again, as many."""

    name = "pyfunc_retry"
    description = (
        "the coding loop told only how many visible tests failed, not which or how (pyfunc_revise's tasks, "
        "item for item): the control that measures whether a revision reads the failure"
    )
    draws_as = "pyfunc_revise"
    verifier = PyFuncRetryVerifier()

    def environment(self) -> type[CodeRevisionEnv]:
        return PyFuncRetryEnv


register(PyFuncRetry())


def planted_observation(ref: CodeReference, t: Template, k: int) -> str:
    """What `pyfunc_revise`'s environment observes of the template's wrong body on the visible
    tests (`code.feedback` over its outputs, closed by `ASK_REVISION`): the wrong body is the
    table's own code, run on the host as the reference bodies are (the sandbox gives the same
    text: tests/domains/test_domains_real_families.py)."""
    bad = reference_function(t, k, bad=True)
    outputs = tuple(TestOutput("value", bad(*args)) for args in ref.inputs())
    text, rate = feedback(ref, CodeRun(outputs, "ok", suite="visible"))
    if rate == 1.0:
        raise TaskError(f"pyfunc_fix: {ref.name}: the planted attempt passes the visible tests")
    return ask_revision(text)


class PyFuncFixVerifier(PyFuncReviseVerifier):
    """The hidden tests' pass rate on the last answer, labelled for pyfunc_fix."""

    domain = "pyfunc_fix"


class PyFuncFixEnv(PyFuncReviseEnv):
    """`PyFuncReviseEnv` (a failure's observation closed by `ASK_REVISION`), its sandbox requests
    labelled pyfunc_fix."""

    def __init__(self, runner: Callable[[Any], Any] | None = None, domain: str = "pyfunc_fix") -> None:
        super().__init__(runner, domain)


class PyFuncFix(PyFuncRevise):
    """The coding loop from its second turn: a planted failing attempt and its observation in the
    prompt (`planted_observation`), then `pyfunc_revise`'s environment and hidden-test verdict."""

    name = "pyfunc_fix"
    description = (
        "the coding feedback loop from its second turn: a failing first attempt and what the visible tests "
        "observed of it are in the prompt; revise; hidden tests decide the reward"
    )
    verifier = PyFuncFixVerifier()

    def make_task(self, index: int, split: Split, difficulty: int, question: str, answer: Any) -> Task:
        task = super().make_task(index, split, difficulty, question, answer)
        t, k = parse_name(answer.name)
        planted = Message("assistant", self._code(task, bad=True))
        return replace(task, prompt=(*task.prompt, planted, Message("tool", planted_observation(answer.visible, t, k))))

    def environment(self) -> type[CodeRevisionEnv]:
        return PyFuncFixEnv

    def cheats(self, task: Task) -> Sequence[str]:
        """pyfunc_revise's cheats, and the planted attempt handed back unchanged."""
        return [*super().cheats(task), self.wrong(task)]


register(PyFuncFix())
