"""vartrack: variable tracking through a long program mixed with prose (RULER's variable tracking shape).

The prompt is a straight-line program whose lines (`VAR QXKT = 41582`, `VAR BRTM = QXKT`:
copy the current value) are scattered among irrelevant sentences. Chains of copies start
at distinct five-digit values. Two kinds of question, drawn half and half at every level:
- which: every variable holding the value V at the end (the answer is the set of names,
  in any order, separated by commas; exactly that set);
- final: the value a variable holds at the end, where some variables are assigned again
  after they were copied, and (from level 3) the asked variable holds another value
  before its chain reaches it.

Difficulty (level): variables per chain, chains, reassignments, `LEVELS`. Context length:
`vartrack@N` (characters, `_longctx`). Declared cheats: the first, last and most frequent
number, the first value assigned to the asked variable, every variable of the first or
of the last chain, every variable of the program, the answer set less its last or plus
one other name (where they are wrong), and the format cheats.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Hashable, Sequence

from posttrain.domains._longctx import INSTRUCTION, Core, LongAnswer, LongContextDomain, integer, position_numbers
from posttrain.domains.registry import register
from posttrain.errors import VerifierError
from posttrain.types import Task

LEVELS = {1: (2, 3, 1), 2: (3, 3, 1), 3: (4, 3, 2), 4: (5, 4, 2), 5: (6, 4, 3)}
"""level -> (variables per chain, chains, reassignments in a `final` question)."""
_LINE = re.compile(r"^VAR ([A-Z]{4}) = (\d+|[A-Z]{4})$", re.MULTILINE)
_WHICH = re.compile(r"Which variables hold the value (\d+) at the end\?")
_FINAL = re.compile(r"What value does ([A-Z]{4}) hold at the end\?")
_NAMES = re.compile(r"[A-Z]{4}(?:\s*(?:,|\band\b|\s)\s*[A-Z]{4})*")


def names_or_number(text: str) -> Hashable | None:
    """vartrack's answer form: an integer, or a set of variable names separated by commas,
    spaces or `and` (None for anything else)."""
    number = integer(text)
    if number is not None:
        return number
    return frozenset(re.findall(r"[A-Z]{4}", text)) if _NAMES.fullmatch(text) else None


def run(text: str) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """The program's variables at its end, and its assignments in order (an undefined source: skipped)."""
    env: dict[str, str] = {}
    lines = _LINE.findall(text)
    for dest, src in lines:
        if src.isdigit():
            env[dest] = src
        elif src in env:
            env[dest] = env[src]
    return env, lines


def _names(rng: random.Random, n: int) -> list[str]:
    out: set[str] = set()
    while len(out) < n:
        name = "".join(rng.choices(string.ascii_uppercase, k=4))
        if name != "VAR":
            out.add(name)
    return sorted(out)


def _merge(rng: random.Random, chains: list[list[str]]) -> list[str]:
    """The chains' lines interleaved at random, each chain's in its order."""
    heads, out = [0] * len(chains), []
    while any(h < len(c) for h, c in zip(heads, chains, strict=True)):
        i = rng.choice([k for k, c in enumerate(chains) if heads[k] < len(c)])
        out.append(chains[i][heads[i]])
        heads[i] += 1
    return out


def _last_use(lines: list[str], name: str) -> int:
    return max(i for i, line in enumerate(lines) if re.search(rf"\b{name}\b", line))


class VarTrack(LongContextDomain):
    base_name = "vartrack"
    description = "track variables through a long program among prose: which hold V, or a final value; @N: context"
    head = "A program runs top to bottom among notes; VAR X = Y copies the current value of Y into X."
    levels = len(LEVELS)
    verifier = LongAnswer(names_or_number)

    def build(self, rng: random.Random, difficulty: int) -> Core:
        per_chain, n_chains, n_again = LEVELS[difficulty]
        names = _names(rng, per_chain * n_chains)
        rng.shuffle(names)
        values = [str(v) for v in rng.sample(range(10000, 100000), n_chains + n_again + 1)]
        chains = []
        for c in range(n_chains):
            own = names[c * per_chain : (c + 1) * per_chain]
            chains.append(
                [f"VAR {own[0]} = {values[c]}"] + [f"VAR {b} = {a}" for a, b in zip(own, own[1:], strict=False)]
            )
        lines = _merge(rng, chains)
        target = names[per_chain - 1]
        if rng.random() < 0.5:
            tail = f"Which variables hold the value {values[0]} at the end? List them all, separated by commas."
            return Core(lines, f"{tail} {INSTRUCTION}", ", ".join(sorted(names[:per_chain])))
        spare = iter(values[n_chains:])
        if difficulty >= 3:  # the asked variable holds another value before its chain reaches it
            first = next(i for i, line in enumerate(lines) if line.startswith(f"VAR {target} ="))
            lines.insert(rng.randint(0, first), f"VAR {target} = {next(spare)}")
        for name in rng.sample([n for n in names if n != target], n_again - (difficulty >= 3)):
            lines.insert(rng.randint(_last_use(lines, name) + 1, len(lines)), f"VAR {name} = {next(spare)}")
        return Core(lines, f"What value does {target} hold at the end? {INSTRUCTION}", values[0])

    def solve(self, question: str) -> str | None:
        """The program run in the text, then the asked set or value read off its end."""
        env, _ = run(question)
        if m := _WHICH.search(question):
            held = sorted(n for n, v in env.items() if v == m.group(1))
            return ", ".join(held) or None
        if m := _FINAL.search(question):
            return env.get(m.group(1))
        raise VerifierError(f"vartrack: no question in {question[-200:]!r}")

    def position_answers(self, question: str) -> dict[str, str]:
        """`final`: numbers by position (first, last, most frequent) and the asked variable's
        first value. `which`: the first and the last chain's variables (a chain: the
        variables holding one starting value), every variable, and the answer less its last
        name or plus another."""
        env, lines = run(question)
        if m := _FINAL.search(question):
            firsts = [src for dest, src in lines if dest == m.group(1) and src.isdigit()]
            return {**position_numbers(question), "first_value": firsts[0] if firsts else ""}
        literals = [src for _, src in lines if src.isdigit()]
        chains = [sorted(n for n, v in env.items() if v == lit) for lit in literals]
        answer = (self.solve(question) or "").split(", ")
        others = sorted(set(env) - set(answer))
        named = {
            "first_chain": chains[0] if chains else [],
            "last_chain": chains[-1] if chains else [],
            "every_variable": sorted(env),
            "one_short": answer[:-1],
            "one_extra": answer + others[:1],
        }
        return {k: ", ".join(v) for k, v in named.items()}

    def wrong(self, task: Task) -> str:
        ref = str(task.reference)
        return f"Answer: {int(ref) + 1}" if ref.isdigit() else f"Answer: {ref.split(', ')[0]}"

    def cheats(self, task: Task) -> Sequence[str]:
        wrong = self.wrong(task).removeprefix("Answer: ")
        return [*self.format_cheats(task, wrong), *self.position_cheats(task)]


register(VarTrack())
