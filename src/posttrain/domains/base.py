"""The Domain contract: a task family with a deterministic sampler and its verifier.

Invariant: `sample(index, split, difficulty)` is a pure function of its
arguments (and the domain's version), and the train and eval splits never
share a task: a task's split is decided by a hash of its canonical question,
so a question that hashes to eval can never be drawn for train.

A new domain: one module `domains/NAME.py` (the file name is the domain's name; add.py is a
whole one) with a `ProceduralDomain` (or `Domain`) subclass: name, category, levels, a
verifier with its label (contracts/verifier.py), gold, wrong and cheats, optionally budget,
cost_class, environment() and an execute step; `register(...)` at its bottom. It may import
this module, types, errors, contracts and the sandbox; never the pipeline, the trainer or
the loop. The contract test (tests/domains/test_domains_contract.py) covers it at once.
docs/extending.md has the steps.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import random
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from posttrain.contracts.budget import Budget as Budget  # the contracts, re-exported where domains read them
from posttrain.contracts.verifier import CheapVerifier as CheapVerifier
from posttrain.contracts.verifier import ExecutingVerifier as ExecutingVerifier
from posttrain.contracts.verifier import ExecutionResult as ExecutionResult
from posttrain.contracts.verifier import Runner as Runner
from posttrain.contracts.verifier import Verifier as Verifier
from posttrain.contracts.verifier import is_cheap as is_cheap
from posttrain.errors import ConfigError, VerifierError
from posttrain.types import CostClass, Episode, Message, Score, Split, StepResult, Task, TaskMeta, Turn

if TYPE_CHECKING:
    from posttrain.configs.tasks import DomainSpec

EVAL_PERCENT = 10
_MAX_SPLIT_ATTEMPTS = 10_000


def stable_hash(*parts: Any) -> int:
    """A process-independent 64-bit hash (never Python's `hash`)."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def stable_rng(*parts: Any) -> random.Random:
    return random.Random(stable_hash(*parts))


_OPEN, _CLOSE = "<answer>", "</answer>"


def extract_answer(text: str) -> str:
    """The model's final answer: the last <answer>...</answer> if present,
    else the whole completion, stripped. The tags pair as a lazy regex would
    (each opening with the first closing after it), found in one linear pass
    (the regex took quadratic time on a completion of unclosed openings)."""
    found, pos = None, 0
    while (start := text.find(_OPEN, pos)) >= 0 and (end := text.find(_CLOSE, start + len(_OPEN))) >= 0:
        found, pos = text[start + len(_OPEN) : end], end + len(_CLOSE)
    return (text if found is None else found).strip()


def last_fenced_block(text: str, languages: tuple[str, ...]) -> str:
    """The last fenced code block (```, or ```LANG for a LANG in `languages`)
    of a completion, else the whole text; stripped and newline-terminated."""
    langs = "|".join(map(re.escape, languages))
    blocks = re.findall(rf"```(?:{langs})?[ \t]*\n(.*?)```", text, re.DOTALL)
    return (blocks[-1] if blocks else text).strip() + "\n"


def answer_cheats(task: Task, wrong: str) -> tuple[str, ...]:
    """Outputs a verifier comparing one extracted answer must reject (`wrong` is a wrong
    answer of the task): empty, blank, the prompt echoed, the answer hidden among wrong
    ones, the answer outside or before the final answer tag, the answer then a second line."""
    ref = str(task.reference)
    return (
        "",
        " ",
        task.prompt[-1].content,
        f"{wrong} {ref} {wrong}",
        f"{ref} <answer>{wrong}</answer>",
        f"<answer>{wrong}</answer> {ref}",
        f"{ref}\n{wrong}",
    )


def question_match(task: Task, pattern: str) -> re.Match[str]:
    """The task's question (its last message) matched in full by `pattern`; VerifierError
    when it does not match (a stricter check that cannot read its question cannot decide)."""
    question = task.prompt[-1].content
    m = re.fullmatch(pattern, question)
    if m is None:
        raise VerifierError(f"audit {task.domain}: cannot parse question {question!r}")
    return m


class ExactMatch:
    """Exact string match of the extracted answer against the reference."""

    name = "exact_match"
    version = "1"
    cheap = True
    """Scores in process in microseconds, no I/O: the pipeline may call it inline (pipeline/play.py)."""

    def score(self, task: Task, episode: Episode) -> Score:
        got = extract_answer(episode.completion)
        ok = got == str(task.reference)
        reason = "" if ok else ("truncated" if episode.finish_reason == "length" else "wrong answer")
        return Score(value=1.0 if ok else 0.0, parts={"outcome": 1.0 if ok else 0.0}, passed=ok, reason=reason)


def weigh(score: Score, weights: Iterable[tuple[str, float]]) -> Score:
    """The reward under per-domain part weights (`tasks.domains.<name>.reward_weights`):
    the weighted mean of the weighted parts the score reports (each clipped to
    [0, 1]; a part the domain does not report is left out of the mean). `passed`,
    the parts and the reason are the verifier's. No weights, or none of the
    weighted parts reported: the verifier's own value, unchanged."""
    named = [(score.parts[k], w) for k, w in weights if k in score.parts and w > 0]
    if not named:
        return score
    total = sum(w for _, w in named)
    value = sum(min(1.0, max(0.0, float(p))) * w for p, w in named) / total
    return dataclasses.replace(score, value=min(1.0, max(0.0, value)))


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
    trains: ClassVar[bool] = True  # False: evaluation-only (a benchmark); a `tasks.domains` pattern skips it

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

    def gold_value(self, task: Task) -> float:
        """What the gold scores on `task` (the contract tests hold `gold` to it). Default 1.0; a
        domain whose best outcome on some tasks is worth less declares it (geo_fix: an honest
        stop on a task that cannot be met scores 0.5)."""
        return 1.0

    @abc.abstractmethod
    def wrong(self, task: Task) -> str:
        """A plausible completion that scores below 1.0."""

    def score(self, task: Task, episode: Episode) -> Score:
        """The verifier's score, weighted by the task's reward weights (see `weigh`)."""
        return weigh(self.verifier.score(task, episode), task.meta.reward_weights)

    @property
    def executes(self) -> bool:
        """Whether the domain declares an execute step (its verifier is an `ExecutingVerifier`)."""
        return isinstance(self.verifier, ExecutingVerifier)

    def execute(self, task: Task, completion: str, run: Runner | None = None) -> ExecutionResult | None:
        """The execute step of a domain that runs what the model wrote: one
        sandbox run (through `run`, default the process-wide pool) whose typed
        result the verifier then reads as Episode.exec_result, so `score` makes
        no sandbox call of its own. None when nothing runs (no such step, or no
        program in the completion). Raises SandboxError when the sandbox, not the
        program, failed: the pipeline retries it, then masks and counts it.
        Default: the verifier's own `execute(task, completion, run)`, if it declares one."""
        if isinstance(self.verifier, ExecutingVerifier):
            return self.verifier.execute(task, completion, run)
        return None

    def environment(self) -> Any | None:
        """A multi-turn environment factory, or None for single-turn domains."""
        return None

    def action_key(self, action: str) -> str:
        """What of a turn's action counts when two are compared (the eval's `repeated-at-turn@t`: a
        revision that hands back the attempt before it): default the whole text, whitespace aside;
        a code domain's, its code (`code.extract_code`), so the prose around it does not count."""
        return " ".join(action.split())

    # ---- branching: tasks derived from the policy's own failed turns (tasks.branch) ----
    def branch_at(self, task: Task, turns: Sequence[Turn]) -> int:
        """How many leading turns of a failed training episode on `task` (`turns`: its turns, with
        observations, parts and sandbox results) a derived task takes into its prompt (`branched`):
        k >= 1 when turn k's observation shows a failure the model can revise from, 0 when nothing
        can be derived. Only called for an episode that was scored and did not pass (never one an
        infra error masked). Default 0: the domain derives no task (`branches` is then False)."""
        return 0

    @property
    def branches(self) -> bool:
        """Whether this domain derives tasks from failed turns (its class overrides `branch_at`)."""
        return type(self).branch_at is not Domain.branch_at

    def branched(self, task: Task, turns: Sequence[tuple[str, str]]) -> Task:
        """The task derived from `task` with these (action, observation) turns of the model's own
        in its prompt: each action an assistant message, each observation a tool message (what the
        episode driver shows the model), the same reference (so the same verifier decides), the
        split and level of `task`, `meta.branched` raised by their number (the episode driver takes
        them off the turn budget), and an id of `task`'s id and a digest of the turns. A pure
        function, so a queue of derived tasks is rebuilt from its turns (tasks/branch.py)."""
        if not turns:
            raise ValueError(f"{self.name}: a derived task needs at least one turn")
        added = tuple(m for a, o in turns for m in (Message("assistant", a), Message("tool", o)))
        digest = hashlib.sha256(repr([list(t) for t in turns]).encode()).hexdigest()[:12]
        meta = dataclasses.replace(task.meta, branched=task.meta.branched + len(turns))
        return dataclasses.replace(task, id=f"{task.id}+b{digest}", prompt=(*task.prompt, *added), meta=meta)

    def variant(self, spec: str) -> Domain | None:
        """The domain named `NAME@spec`, this family at a setting that is not a level (a
        long-context family's context length: `keychain@8000`), or None when the family
        has none. The registry asks it the first time such a name is used (and keeps the
        answer); a malformed `spec` raises TaskError naming what it may be."""
        return None

    # ---- what the monitor and the eval verifier ask of a domain (declared, with defaults) ----
    pretrain_pool: ClassVar[int | None] = None
    """Multi-turn domains whose environment runs in the sandbox: the base pretraining corpus plays
    this many distinct transcripts of the domain through its real environment (train tasks 0..N-1,
    each gold or buggy as drawn at its first use) and reuses them (model/pretrain.py), so a base
    build pays N episodes of sandbox steps, not one per example. None: a fresh transcript each
    example (in-process environments, e.g. lookup)."""

    partial_credit: bool = False
    """Whether the verifier gives scores strictly between 0 and 1 (a share of the fields,
    checks or tests passed); False: every score is 0 or 1. A domain sets it as a class or
    instance attribute; its verifier reads it (rgym's exact scorer rounds to 0/1 without it)."""

    def cheats(self, task: Task) -> Sequence[str]:
        """Outputs that do not solve `task` and that a sound verifier must reject. The
        monitor's reward-hacking probe scores them against the live verifier and refuses a
        domain whose verifier passes one. Default: none (the domain is not probed)."""
        return ()

    def audit(self, task: Task, completion: str) -> bool:
        """A check stricter than the reward: whether `completion` really solves `task`
        (the answer recomputed from the question instead of the stored reference, hidden
        tests the reward does not use, ...). The monitor audits each step's top-reward
        rollouts with it; the eval verifier ANDs it into its verdict. Raise VerifierError
        when it cannot decide (an infra error, never a failure). Default: True, no
        stricter check (`has_audit` is then False and nobody calls it)."""
        return True

    @property
    def has_audit(self) -> bool:
        """Whether this domain declares a stricter check (its class overrides `audit`)."""
        return type(self).audit is not Domain.audit

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


def actions_of(episode: Episode) -> list[str]:
    """The actions of an episode: its turns', or the non-empty lines of one completion (a
    multi-turn domain's single-completion form, one action per line)."""
    if episode.turns:
        return [t.action for t in episode.turns]
    return [line for line in episode.completion.splitlines() if line.strip()]


def play_actions(env: Any, task: Task, actions: Sequence[str]) -> Episode:
    """The episode a fresh environment `env` gives for `actions`, stepped in order until one ends
    it (each step's observation, execution result and parts kept in its Turn; the last turn's
    execution result is the episode's), then closed: what the episode driver builds, without a
    model. A step may answer a StepResult or an `(observation, done)` pair."""
    env.reset(task)
    turns: list[Turn] = []
    try:
        for action in actions:
            got = env.step(action)
            res = got if isinstance(got, StepResult) else StepResult(str(got[0]), bool(got[1]))
            images = tuple(i.sha256 for i in res.images)
            turns.append(Turn(action, res.observation, res.exec_result, dict(res.parts), images))
            if res.done:
                break
    finally:
        env.close()
    last = turns[-1] if turns else None
    return Episode(last.action if last else "", tuple(turns), exec_result=last.exec_result if last else None)


def domain_budget(domain: Domain, spec: DomainSpec | None = None, cap: int | None = None) -> Budget:
    """One domain's effective budget (`spec`: its tasks.domains entry, or None): its declaration,
    each field replaced where the spec sets it (max_tokens, max_turns, max_seconds), its tokens
    then capped by `cap` when one is set (pipeline/budget.py says who resolves budgets with it)."""
    b = domain.budget
    tokens = (spec and spec.max_tokens) or b.tokens
    turns = (spec and spec.max_turns) or b.turns
    seconds = (spec and spec.max_seconds) or b.seconds
    train_from = (spec and spec.train_from_turn) or b.train_from
    if train_from > turns:
        raise ConfigError(
            f"tasks.domains.{domain.name}.train_from_turn: {train_from} is past the domain's {turns} turn(s): "
            "no action would carry the loss (a single-turn domain trains from turn 1)"
        )
    return dataclasses.replace(
        b, tokens=min(tokens, cap) if cap else tokens, turns=turns, seconds=seconds, train_from=train_from
    )
