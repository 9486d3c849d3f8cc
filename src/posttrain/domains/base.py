"""The Domain contract: a task family with a deterministic sampler and its verifier.

Invariant: `sample(index, split, difficulty)` is a pure function of its
arguments (and the domain's version), and the train and eval splits never
share a task: a task's split is decided by a hash of its canonical question,
so a question that hashes to eval can never be drawn for train.
"""
from __future__ import annotations

import abc
import hashlib
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from posttrain.types import CostClass, Episode, Message, Score, Split, Task, TaskMeta

EVAL_PERCENT = 10
_MAX_SPLIT_ATTEMPTS = 10_000


@dataclass(frozen=True)
class Budget:
    """Per-episode limits: turns, generated tokens per turn, wall seconds. The
    pipeline and the evaluator generate each domain's turns with its own token
    budget (overridable per domain in `tasks.domains`)."""

    turns: int = 1
    tokens: int = 16
    seconds: float = 30.0


Runner = Callable[[Any], Any]
"""Runs one sandbox ExecRequest and returns its ExecResult (the pipeline's pool, or
the process-wide one)."""


class ExecutionResult(Protocol):
    """What a domain's `execute` step returns: a frozen record the verifier reads
    (Episode.exec_result) and whose `summary()` (plain JSON data: status, exit
    code, cpu_s, wall_s, the program, per-test outcomes or the report, truncated
    output) goes into the trace row."""

    status: str

    def summary(self) -> dict[str, Any]: ...


class Verifier(Protocol):
    name: str
    version: str

    def score(self, task: Task, episode: Episode) -> Score: ...


def stable_hash(*parts: Any) -> int:
    """A process-independent 64-bit hash (never Python's `hash`)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def stable_rng(*parts: Any) -> random.Random:
    return random.Random(stable_hash(*parts))


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(text: str) -> str:
    """The model's final answer: the last <answer>...</answer> if present,
    else the whole completion, stripped."""
    found = _ANSWER_TAG.findall(text)
    return (found[-1] if found else text).strip()


def last_fenced_block(text: str, languages: tuple[str, ...]) -> str:
    """The last fenced code block (```, or ```LANG for a LANG in `languages`)
    of a completion, else the whole text; stripped and newline-terminated."""
    langs = "|".join(map(re.escape, languages))
    blocks = re.findall(rf"```(?:{langs})?[ \t]*\n(.*?)```", text, re.DOTALL)
    return (blocks[-1] if blocks else text).strip() + "\n"


class ExactMatch:
    """Exact string match of the extracted answer against the reference."""

    name = "exact_match"
    version = "1"

    def score(self, task: Task, episode: Episode) -> Score:
        got = extract_answer(episode.completion)
        ok = got == str(task.reference)
        reason = "" if ok else ("truncated" if episode.finish_reason == "length" else "wrong answer")
        return Score(value=1.0 if ok else 0.0, parts={"outcome": 1.0 if ok else 0.0}, passed=ok, reason=reason)


class Domain(abc.ABC):
    """A task family. Subclasses set the class attributes and implement
    `sample` (or `generate`, through `ProceduralDomain`)."""

    name: ClassVar[str]
    category: ClassVar[str]
    description: ClassVar[str] = ""
    version: ClassVar[str] = "1"
    levels: ClassVar[int] = 1
    cost_class: ClassVar[CostClass] = "short"
    budget: ClassVar[Budget] = Budget()
    verifier: Verifier = ExactMatch()

    @abc.abstractmethod
    def sample(self, index: int, split: Split, difficulty: int) -> Task:
        """Deterministic task number `index` of `split` at `difficulty` (1..levels)."""

    @abc.abstractmethod
    def gold(self, task: Task) -> str:
        """A completion that scores 1.0 (the contract test uses it)."""

    def gold_turns(self, task: Task) -> list[str]:
        """The actions of a gold multi-turn episode, one per turn, that the domain's
        environment and verifier score 1.0 (the contract test drives them through the
        training pipeline). Default: the single gold completion."""
        return [self.gold(task)]

    @abc.abstractmethod
    def wrong(self, task: Task) -> str:
        """A plausible completion that scores below 1.0."""

    def score(self, task: Task, episode: Episode) -> Score:
        return self.verifier.score(task, episode)

    @property
    def executes(self) -> bool:
        """Whether the domain declares an execute step (its verifier has `execute`)."""
        return callable(getattr(self.verifier, "execute", None))

    def execute(self, task: Task, completion: str, run: Runner | None = None) -> ExecutionResult | None:
        """The execute step of a domain that runs what the model wrote: one
        sandbox run (through `run`, default the process-wide pool) whose typed
        result the verifier then reads as Episode.exec_result, so `score` makes
        no sandbox call of its own. None when nothing runs (no such step, or no
        program in the completion). Raises SandboxError when the sandbox, not the
        program, failed: the pipeline retries it, then masks and counts it.
        Default: the verifier's own `execute(task, completion, run)`, if it has one."""
        step = getattr(self.verifier, "execute", None)
        return step(task, completion, run) if callable(step) else None

    def environment(self) -> Any | None:
        """A multi-turn environment factory, or None for single-turn domains."""
        return None

    @property
    def taskset_version(self) -> str:
        return f"{stable_hash(self.name, self.version, type(self).__qualname__):016x}"[:12]

    def check_difficulty(self, difficulty: int) -> None:
        if not 1 <= difficulty <= self.levels:
            raise ValueError(f"{self.name}: difficulty must be in 1..{self.levels}, got {difficulty}")


def split_of(domain: str, question: str) -> Split:
    """The split a question belongs to, decided by its normalised text."""
    key = " ".join(question.split()).lower()
    return "eval" if stable_hash("split", domain, key) % 100 < EVAL_PERCENT else "train"


class ProceduralDomain(Domain):
    """A domain defined by `generate(rng, difficulty) -> (question, answer)`.
    Gold is the answer itself; a wrong answer is derived by `corrupt`."""

    @abc.abstractmethod
    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, str]:
        """One question and its exact answer."""

    def corrupt(self, answer: str) -> str:
        return answer + "0" if answer else "x"

    def sample(self, index: int, split: Split, difficulty: int) -> Task:
        self.check_difficulty(difficulty)
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        for attempt in range(_MAX_SPLIT_ATTEMPTS):
            rng = stable_rng(self.name, self.version, difficulty, split, index, attempt)
            question, answer = self.generate(rng, difficulty)
            if split_of(self.name, question) == split:
                return self.make_task(index, split, difficulty, question, answer)
        raise RuntimeError(f"{self.name}: no {split} task found at difficulty {difficulty}")

    def make_task(self, index: int, split: Split, difficulty: int, question: str, answer: Any) -> Task:
        return Task(
            id=f"{self.name}:{split}:{difficulty}:{index}",
            domain=self.name,
            prompt=(Message("user", question),),
            reference=answer,
            meta=TaskMeta(split=split, difficulty=difficulty, source="posttrain", taskset_version=self.taskset_version),
        )

    def gold(self, task: Task) -> str:
        return str(task.reference)

    def wrong(self, task: Task) -> str:
        return self.corrupt(str(task.reference))
