"""Helpers of the long-context families (keychain, vartrack, noisygraph, memread; not a domain itself).

Two dials, apart. Difficulty (the level) sets the structure a task must be solved
through: hops, variables, distractor chains, irrelevant facts. Context length is the
domain's own setting: `NAME@N` is domain NAME whose prompt is filled with irrelevant
prose up to N characters (`LongContextDomain.variant`, resolved by the registry on
first use, so `tasks.domains`, `eval.transfer_domains` and worker processes name a
length like any domain). The plain name is the default length, `DEFAULT_CONTEXT`.

Invariant: a prompt is the task's facts, in their order, woven among filler sentences
at seeded positions, then the question; its length is at most the context (and at
least the context less one filler sentence) whenever the facts and the question fit in
it; a level whose facts alone are longer gets no filler (the prompt is then as long as
its facts: `min_context` reports it). Filler never states a fact of the task family
(no key, no variable, no quantity the question can ask about); its numbers are years
and small counts, so position statistics (the first, last or most frequent number)
have something to pick. A family's position cheats (`position_answers`) are declared
where they are wrong (`position_cheats`); how often each is right by chance is
bounded by the tests, never by redrawing tasks (a redraw would make "never the first
candidate" a rule the model could learn).

The answer (`final_answer`): every `<answer>...</answer>` body and every line that
starts `Answer:` is a candidate; there must be at least one, each must have the
family's form (a number, a set of names) and all must agree. So text around the
answer is fine, while two different answers, a list of guesses or a candidate of
the wrong form score 0.
"""

from __future__ import annotations

import abc
import random
import re
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from posttrain.domains.base import Budget, ProceduralDomain, split_of, stable_rng
from posttrain.errors import TaskError
from posttrain.types import Episode, Score, Split, Task

DEFAULT_CONTEXT = 1000
"""Characters of a plain-named family's prompt. The embedded tokenizer is one token per
character, and its base accepts 8,192 positions (BaseConfig.max_positions), so the plain
name (L) and its 4L and 8L variants (`NAME@4000`, `NAME@8000`) fit it with room for the
answer (configs/long.yaml)."""
CONTEXT_RANGE = (200, 2_000_000)
"""The contexts `NAME@N` may ask for, in characters."""
INSTRUCTION = "Give the final answer alone on the last line as 'Answer: X'."
_MAX_ATTEMPTS = 10_000
"""Draws `sample` tries for a task of the split asked (about 10 for eval)."""
MAX_COMPLETION = 20_000
"""A completion longer than this (characters) is not read: it scores 0."""

_FIRST = ("Ada", "Bram", "Cleo", "Dario", "Edda", "Finn", "Greta", "Hugo", "Ines", "Jonas", "Kira", "Lars")
_NOUNS = ("river", "market", "bridge", "garden", "harbour", "library", "orchard", "tower", "valley", "mill")
_ADJ = ("old", "quiet", "narrow", "busy", "green", "stone", "windy", "small", "long", "bright")
_VERBS = ("walked past", "painted", "visited", "described", "repaired", "photographed", "mapped", "sketched")
_TIMES = ("in spring", "at dawn", "after the rain", "on a Sunday", "before noon", "in the autumn", "at dusk")


def _filler(rng: random.Random) -> str:
    """One irrelevant sentence (a few of them carry a year or a small count)."""
    kind = rng.randrange(6)
    who, adj, noun = rng.choice(_FIRST), rng.choice(_ADJ), rng.choice(_NOUNS)
    if kind == 0:
        return f"In {rng.randint(1890, 2020)} {who} {rng.choice(_VERBS)} the {adj} {noun}."
    if kind == 1:
        return f"{who} counted {rng.randint(2, 40)} boats near the {adj} {noun}."
    if kind == 2:
        return f"The {adj} {noun} was quiet {rng.choice(_TIMES)}."
    if kind == 3:
        return f"{who} {rng.choice(_VERBS)} the {noun} {rng.choice(_TIMES)}."
    if kind == 4:
        return f"Nobody remembers who built the {adj} {noun}."
    return f"{who} wrote a letter about the {noun} {rng.choice(_TIMES)}."


def weave(
    rng: random.Random, facts: Sequence[str], context: int, head: str, tail: str, sep: str = "\n"
) -> tuple[str, list[int]]:
    """`head`, the facts in their order among filler sentences, then `tail`, joined by `sep`:
    at most `context` characters when the facts fit (filler stops before it would pass it).
    Returns the text and the positions of the facts among the body's lines."""
    fixed = len(head) + len(tail) + sum(len(f) + len(sep) for f in facts) + 2 * len(sep)
    budget = context - fixed
    filler: list[str] = []
    while budget > 0:
        line = _filler(rng)
        if len(line) + len(sep) > budget:
            break
        filler.append(line)
        budget -= len(line) + len(sep)
    total = len(filler) + len(facts)
    at = sorted(rng.sample(range(total), len(facts)))
    body, fi, si = [], 0, 0
    for i in range(total):
        if si < len(at) and at[si] == i:
            body.append(facts[si])
            si += 1
        else:
            body.append(filler[fi])
            fi += 1
    return sep.join([head, *body, tail]), at


NUMBER = re.compile(r"(?<![\w-])\d+(?![\w-])")


def position_numbers(text: str) -> dict[str, str]:
    """The answers a reader of positions would give: the first, the last and the most
    frequent number of `text` (ties: the first met); empty without numbers."""
    nums = NUMBER.findall(text)
    if not nums:
        return {}
    counts = Counter(nums)
    top = max(counts.values())
    return {
        "first_number": nums[0],
        "last_number": nums[-1],
        "frequent_number": next(x for x in nums if counts[x] == top),
    }


def _candidates(text: str) -> list[str]:
    """Every `<answer>` body (paired as `base.extract_answer` pairs them) and every
    `Answer:` line's rest, in order."""
    out, pos = [], 0
    while (start := text.find("<answer>", pos)) >= 0 and (end := text.find("</answer>", start + 8)) >= 0:
        out.append(text[start + 8 : end])
        pos = end + 9
    for line in text.splitlines():
        body = line.strip().strip("*").strip()
        if body[:7].lower() == "answer:":
            out.append(body[7:])
    return [c.strip().strip("*`").strip().rstrip(".").strip() for c in out]


Canon = Callable[[str], Hashable | None]
"""A family's answer form: the canonical value of one candidate, None when it has not the form."""


def final_answer(text: str, canon: Canon) -> tuple[Hashable | None, str]:
    """The one answer of `text` in the family's form, or None and why not."""
    if len(text) > MAX_COMPLETION:
        return None, "completion too long"
    found = _candidates(text)
    if not found:
        return None, "no answer"
    values = [canon(c) for c in found]
    if any(v is None for v in values):
        return None, "an answer not in the required form"
    if len(set(values)) > 1:
        return None, "several different answers"
    return values[0], ""


def integer(text: str) -> int | None:
    """An integer answer (a thousands comma allowed), else None."""
    t = text.replace(",", "")
    return int(t) if re.fullmatch(r"-?\d{1,12}", t) else None


class LongAnswer:
    """1.0 when the completion's one answer (`final_answer`) equals the reference in the
    family's form; parts: format (one answer, in form) and outcome."""

    name = "long_answer"
    version = "1"
    cheap = True

    def __init__(self, canon: Canon) -> None:
        self.canon = canon

    def score(self, task: Task, episode: Episode) -> Score:
        got, why = final_answer(episode.completion, self.canon)
        ok = got is not None and got == self.canon(str(task.reference))
        if not ok and episode.finish_reason == "length":
            why = "truncated"
        elif not ok and not why:
            why = "wrong answer"
        parts = {"format": float(got is not None), "outcome": float(ok)}
        return Score(float(ok), parts, ok, "" if ok else why)


@dataclass(frozen=True)
class Core:
    """What a task is made of before filler: its facts in order, the question (the prompt's
    tail) and the answer."""

    facts: list[str]
    tail: str
    answer: str


class LongContextDomain(ProceduralDomain):
    """A long-context family: `context` characters of prompt, difficulty by level.
    Subclasses set `base_name`, `head` (the prompt's first line) and a verifier `LongAnswer`,
    and implement `build(rng, difficulty) -> Core`, `solve(question)` (the answer worked out
    from the prompt's text) and `position_answers(question)` (the answers its position
    cheats give). A task's core (facts and question) is drawn from a seed that names the
    family, not the context, and its split is decided by the core alone: task i of
    `NAME@N` is task i of `NAME` (the same facts in the same order, the same answer) with
    more or less filler, so a held-out question stays held out at every length, and an
    evaluation at 4L or 8L asks the very questions held out at L."""

    base_name: ClassVar[str]
    head: ClassVar[str]
    category = "long_context"
    budget = Budget(turns=1, tokens=96, seconds=120.0)

    def __init__(self, context: int | None = None) -> None:
        """The family at `DEFAULT_CONTEXT` under its plain name, or at `context` characters as `NAME@context`."""
        self.context = DEFAULT_CONTEXT if context is None else context
        self.name = self.base_name if context is None else f"{self.base_name}@{context}"  # type: ignore[misc]

    def variant(self, spec: str) -> LongContextDomain:
        """This family at `spec` characters of context (`NAME@N`); TaskError naming the
        allowed range for anything but an integer in it."""
        lo, hi = CONTEXT_RANGE
        if not re.fullmatch(r"[1-9]\d{0,8}", spec) or not lo <= int(spec) <= hi:
            raise TaskError(
                f"domain {self.base_name}@{spec}: the context after '@' must be a whole number of "
                f"characters in {lo}..{hi} (e.g. {self.base_name}@{4 * DEFAULT_CONTEXT})"
            )
        return type(self)(int(spec))

    @property
    def canon(self) -> Canon:
        """The family's answer form (its verifier's)."""
        return cast(LongAnswer, self.verifier).canon

    @abc.abstractmethod
    def build(self, rng: random.Random, difficulty: int) -> Core:
        """The facts, question and answer of one task."""

    @abc.abstractmethod
    def solve(self, question: str) -> str | None:
        """The answer worked out from the prompt's text alone (None: it cannot be)."""

    @abc.abstractmethod
    def position_answers(self, question: str) -> dict[str, str]:
        """The answer each of the family's position cheats gives on a prompt (the first, last
        or most frequent candidate...), by the cheat's name; one may equal the gold by chance."""

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, str]:
        core = self.build(rng, difficulty)
        return weave(rng, core.facts, self.context, self.head, core.tail)[0], core.answer

    def sample(self, index: int, split: Split, difficulty: int) -> Task:
        self.check_difficulty(difficulty)
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        for attempt in range(_MAX_ATTEMPTS):
            rng = stable_rng(self.base_name, self.version, difficulty, split, index, attempt)
            core = self.build(rng, difficulty)
            if split_of(self.base_name, "\n".join([*core.facts, core.tail])) == split:
                return self.make_task(index, split, difficulty, *self.compose(rng, core))
        raise RuntimeError(f"{self.name}: no {split} task found at difficulty {difficulty}")

    def compose(self, rng: random.Random, core: Core) -> tuple[str, Any]:
        """The prompt and the reference of a task from its core: the facts woven among
        filler up to the context, the question last; the answer."""
        return weave(rng, core.facts, self.context, self.head, core.tail)[0], core.answer

    def min_context(self, difficulty: int, tasks: int = 20) -> int:
        """The longest prompt of `tasks` draws at `difficulty` with no filler: a context
        below it makes some prompts longer than asked."""
        bare = type(self)(CONTEXT_RANGE[0])
        return max(len(bare.sample(i, "train", difficulty).prompt[-1].content) for i in range(tasks))

    def audit(self, task: Task, completion: str) -> bool:
        """The answer worked out again from the question's text (`solve`), not the stored reference."""
        answer = self.solve(task.prompt[-1].content)
        got, _ = final_answer(completion, self.canon)
        return answer is not None and got is not None and got == self.canon(answer)

    def gold(self, task: Task) -> str:
        return f"Answer: {task.reference}"

    def position_cheats(self, task: Task) -> list[str]:
        """`Answer: X` for each position answer X that is not the gold (one that equals it
        is a right answer by chance: how often, tests/domains/test_longctx.py bounds)."""
        gold = self.canon(str(task.reference))
        given = self.position_answers(task.prompt[-1].content).values()
        wrong = [a for a in given if a and self.canon(a) != gold]
        return [f"Answer: {a}" for a in dict.fromkeys(wrong)]

    def format_cheats(self, task: Task, wrong: str) -> list[str]:
        """Outputs of the wrong shape: empty, the prompt echoed, the gold among or beside a
        wrong answer, a hedge, the gold outside an answer line."""
        ref = str(task.reference)
        return [
            "",
            task.prompt[-1].content,
            f"Answer: {ref}\nAnswer: {wrong}",
            f"<answer>{wrong}</answer>\nAnswer: {ref}",
            f"Answer: {ref} or {wrong}",
            f"The answer is {ref}.",
            f"{ref}",
        ]
