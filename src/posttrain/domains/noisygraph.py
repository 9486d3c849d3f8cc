"""noisygraph: a graph of quantities stated in sentences, with irrelevant ones mixed in (GSM-Infinite's shape).

Each quantity is a count of animals at a place (`Oak Zoo has 7 owls.`); the others are
defined from them (`Elm Park has 3 more foxes than Oak Zoo has owls.`, `... 2 times as
many ...`, `... 4 fewer ...`, from level 3 `Ash Farm has as many hens as Oak Zoo has
owls and Elm Park has foxes together.`). The question asks one quantity; the sentences it
needs form a tree of `ops` operations down to stated numbers. Irrelevant quantities
(stated outright or defined from the needed ones, so they look relevant) and filler prose
are mixed in, in a seeded order. Every value stays in 0..999.

Difficulty (level): operations on the asked quantity's tree and irrelevant quantities,
`LEVELS`. Context length: `noisygraph@N` (characters, `_longctx`). Declared cheats: the
first, last and most frequent number of the prompt, and the value of the quantity the
first and the last sentence define (where they are wrong), and the format cheats.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from posttrain.domains._longctx import INSTRUCTION, Core, LongAnswer, LongContextDomain, integer, position_numbers
from posttrain.domains.registry import register
from posttrain.errors import VerifierError
from posttrain.types import Task

LEVELS = {1: (1, 2), 2: (2, 3), 3: (3, 3), 4: (4, 4), 5: (6, 4)}
"""level -> (operations on the asked quantity's tree, irrelevant quantities); sums from level 3."""
ANIMALS = ("owls", "foxes", "hens", "goats", "bees", "crows", "deer", "mice", "ducks", "frogs", "bats", "seals")
PLACES = ("Oak Zoo", "Elm Park", "Ash Farm", "Fern Wood", "Pine Vale", "Reed Bay", "Moss Hill", "Sage Field")
MAX_VALUE = 999

_Q = r"([A-Z][a-z]+ [A-Z][a-z]+) has"
_LIT = re.compile(rf"{_Q} (\d+) (\w+)\.")
_ADD = re.compile(rf"{_Q} (\d+) (more|fewer) (\w+) than ([A-Z][a-z]+ [A-Z][a-z]+) has (\w+)\.")
_MUL = re.compile(rf"{_Q} (\d+) times as many (\w+) as ([A-Z][a-z]+ [A-Z][a-z]+) has (\w+)\.")
_SUM = re.compile(
    rf"{_Q} as many (\w+) as ([A-Z][a-z]+ [A-Z][a-z]+) has (\w+) and ([A-Z][a-z]+ [A-Z][a-z]+) has (\w+) together\."
)
_ASK = re.compile(r"How many (\w+) does ([A-Z][a-z]+ [A-Z][a-z]+) have\?")
_ANY = re.compile(rf"{_Q} (?:(\d+) (\w+)\.|\d+ (?:more|fewer) (\w+) than|\d+ times as many (\w+) as|as many (\w+) as)")

Quantity = tuple[str, str]
"""(place, animals)."""


@dataclass
class _Graph:
    """Quantities being defined: each one's sentence and value."""

    rng: random.Random
    free: list[Quantity]
    sentences: dict[Quantity, str] = field(default_factory=dict)
    values: dict[Quantity, int] = field(default_factory=dict)

    def new(self) -> Quantity:
        return self.free.pop()

    def literal(self, q: Quantity) -> None:
        self.values[q] = self.rng.randint(2, 30)
        self.sentences[q] = f"{q[0]} has {self.values[q]} {q[1]}."

    def derive(self, q: Quantity, sources: list[Quantity]) -> None:
        """`q` defined from `sources` (valued already) by an operation kept in 0..MAX_VALUE."""
        (p, a), rng = q, self.rng
        if len(sources) == 2:
            (p1, a1), (p2, a2) = sources
            self.values[q] = self.values[sources[0]] + self.values[sources[1]]
            self.sentences[q] = f"{p} has as many {a} as {p1} has {a1} and {p2} has {a2} together."
            return
        src, (p1, a1) = self.values[sources[0]], sources[0]
        k, kind = rng.randint(2, 9), rng.choice(("more", "fewer", "times"))
        if not 0 <= {"more": src + k, "fewer": src - k, "times": src * k}[kind] <= MAX_VALUE:
            kind = "more" if src + k <= MAX_VALUE else "fewer"
        if kind == "times":
            self.values[q], self.sentences[q] = src * k, f"{p} has {k} times as many {a} as {p1} has {a1}."
        else:
            self.values[q] = src + k if kind == "more" else src - k
            self.sentences[q] = f"{p} has {k} {kind} {a} than {p1} has {a1}."


def _tree(graph: _Graph, target: Quantity, ops: int, sums: bool) -> list[Quantity]:
    """Define `target` through `ops` operations down to stated numbers; returns the needed
    quantities (the target first)."""
    shape: dict[Quantity, list[Quantity]] = {target: []}
    frontier, order = [target], [target]
    for _ in range(ops):
        q = frontier.pop(graph.rng.randrange(len(frontier)))
        children = [graph.new() for _ in range(2 if sums and graph.rng.random() < 0.4 else 1)]
        shape[q] = children
        frontier += children
        order += children
        shape.update({c: [] for c in children})
    for q in reversed(order):  # children before their parents
        if shape[q]:
            graph.derive(q, shape[q])
        else:
            graph.literal(q)
    return order


def evaluate(text: str) -> dict[Quantity, int]:
    """Every quantity the sentences of `text` define, worked out (a cycle or a missing source: left out)."""
    rules: dict[Quantity, tuple[str, int, list[Quantity]]] = {}
    for p, n, a in _LIT.findall(text):
        rules[(p, a)] = ("lit", int(n), [])
    for p, k, kind, a, p1, a1 in _ADD.findall(text):
        rules[(p, a)] = (kind, int(k), [(p1, a1)])
    for p, k, a, p1, a1 in _MUL.findall(text):
        rules[(p, a)] = ("times", int(k), [(p1, a1)])
    for p, a, p1, a1, p2, a2 in _SUM.findall(text):
        rules[(p, a)] = ("sum", 0, [(p1, a1), (p2, a2)])
    values: dict[Quantity, int] = {}

    def value(q: Quantity, depth: int = 0) -> int | None:
        if q in values or q not in rules or depth > len(rules):
            return values.get(q)
        kind, k, srcs = rules[q]
        got = [value(s, depth + 1) for s in srcs]
        if any(g is None for g in got):
            return None
        v = [int(g or 0) for g in got]
        out = {"lit": k, "more": v[0] + k if v else 0, "fewer": v[0] - k if v else 0}.get(kind)
        values[q] = out if out is not None else (v[0] * k if kind == "times" else sum(v))
        return values[q]

    for q in rules:
        value(q)
    return values


class NoisyGraph(LongContextDomain):
    base_name = "noisygraph"
    description = "one quantity of a graph of counts stated in sentences, irrelevant ones mixed in; @N: context"
    head = "Notes about animals in several places. Some sentences define counts from others."
    levels = len(LEVELS)
    verifier = LongAnswer(integer)

    def build(self, rng: random.Random, difficulty: int) -> Core:
        ops, noise = LEVELS[difficulty]
        while True:  # a sum may pass MAX_VALUE: the tree is drawn again (one level-5 tree in 500)
            free = [(p, a) for p in PLACES for a in ANIMALS]
            rng.shuffle(free)
            graph = _Graph(rng, free)
            target = graph.new()
            _tree(graph, target, ops, difficulty >= 3)
            if max(graph.values.values()) <= MAX_VALUE:
                break
        for _ in range(noise):
            q = graph.new()
            if rng.random() < 0.5:
                graph.literal(q)
            else:
                graph.derive(q, [rng.choice(sorted(graph.values))])
        facts = [graph.sentences[q] for q in graph.sentences]
        rng.shuffle(facts)
        question = f"How many {target[1]} does {target[0]} have? {INSTRUCTION}"
        return Core(facts, question, str(graph.values[target]))

    def solve(self, question: str) -> str | None:
        """The sentences worked out, then the asked quantity read off."""
        m = _ASK.search(question)
        if m is None:
            raise VerifierError(f"noisygraph: no question in {question[-200:]!r}")
        got = evaluate(question).get((m.group(2), m.group(1)))
        return None if got is None else str(got)

    def position_answers(self, question: str) -> dict[str, str]:
        """The first, last and most frequent number, and the values of the quantities the
        first and the last defining sentence define."""
        values = evaluate(question)
        defined = [(m.group(1), next(g for g in m.groups()[2:] if g)) for m in _ANY.finditer(question)]
        ends = [str(values.get(q, "")) for q in (defined[:1] + defined[-1:])]
        return {**position_numbers(question), "first_defined": ends[0], "last_defined": ends[-1]}

    def wrong(self, task: Task) -> str:
        return f"Answer: {int(task.reference) + 1}"

    def cheats(self, task: Task) -> Sequence[str]:
        return [*self.format_cheats(task, str(int(task.reference) + 1)), *self.position_cheats(task)]


register(NoisyGraph())
