"""arith_fmt: arithmetic with a required answer format, for a real instruct model (issue 37).

The question is plain English ("What is 7 + 5? ...") and asks for the working, then the
answer alone on the last line as `Answer: N`. The verifier (`FormatAnswer`) takes the
last non-empty line; it must be exactly `Answer: N` (an optional `**` bold and a final
period tolerated, nothing else), no other line may start with `Answer:`, and N must
equal the reference. So an answer given in several formats, two answers, or the right
number anywhere but the required line scores 0. Levels by operand size, from one digit
up, so the curriculum by pass rate can move up: 1+1-digit addition, 2+1, 2+2, 2-digit
subtraction, 1x1 and 2x1 multiplication. SmolLM2-135M-Instruct gets one-digit
additions right about two times in three and two-digit ones rarely (issue 37).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from posttrain.domains.base import Budget, ProceduralDomain, question_match
from posttrain.domains.registry import register
from posttrain.types import Episode, Score, Task

INSTRUCTION = "Think step by step if you need to, then give the final answer alone on the last line as 'Answer: N'."
# level -> (operation, digits of a, digits of b)
LEVELS = {1: ("+", 1, 1), 2: ("+", 2, 1), 3: ("+", 2, 2), 4: ("-", 2, 2), 5: ("*", 1, 1), 6: ("*", 2, 1)}
WORDS = {"+": "plus", "-": "minus", "*": "times"}
_LINE = re.compile(r"\**\s*Answer:\s*\**\s*(-?\d+)\s*\**\.?\s*\**")
_QUESTION = r"What is (\d+) (plus|minus|times) (\d+)\?.*"


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def _apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def final_answer(text: str) -> str | None:
    """The number on the required last line, or None when the completion does not end with
    exactly one `Answer: N` line (no other line may start with `Answer:`)."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return None
    if sum(1 for ln in lines if ln.lstrip("*").lstrip().lower().startswith("answer:")) != 1:
        return None
    m = _LINE.fullmatch(lines[-1])
    return m.group(1) if m else None


class FormatAnswer:
    """1.0 when the last line is exactly `Answer: N` with N the reference (see `final_answer`);
    parts: format (the last line has the required form, alone) and outcome."""

    name = "format_answer"
    version = "1"
    cheap = True

    def score(self, task: Task, episode: Episode) -> Score:
        got = final_answer(episode.completion)
        ok = got is not None and int(got) == int(task.reference)
        if ok:
            reason = ""
        elif episode.finish_reason == "length":
            reason = "truncated"
        else:
            reason = "no 'Answer: N' last line" if got is None else "wrong answer"
        fmt = 0.0 if got is None else 1.0
        return Score(1.0 if ok else 0.0, {"format": fmt, "outcome": 1.0 if ok else 0.0}, ok, reason)


class ArithFormat(ProceduralDomain):
    name = "arith_fmt"
    category = "arithmetic"
    description = "a+b, a-b, a*b in words; the answer alone on the last line as 'Answer: N'; levels 1+1 digits up"
    levels = len(LEVELS)
    budget = Budget(turns=1, tokens=96, seconds=60.0)
    verifier = FormatAnswer()

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, str]:
        op, da, db = LEVELS[difficulty]
        a, b = _operand(rng, da), _operand(rng, db)
        if op == "-" and b > a:
            a, b = b, a
        return f"What is {a} {WORDS[op]} {b}? {INSTRUCTION}", str(_apply(op, a, b))

    def _operands(self, task: Task) -> tuple[int, str, int]:
        a, word, b = question_match(task, _QUESTION).groups()
        return int(a), {v: k for k, v in WORDS.items()}[word], int(b)

    def gold(self, task: Task) -> str:
        a, op, b = self._operands(task)
        return f"{a} {op} {b} = {task.reference}\nAnswer: {task.reference}"

    def wrong(self, task: Task) -> str:
        return f"Answer: {int(task.reference) + 1}"

    def cheats(self, task: Task) -> Sequence[str]:
        """The answer in several formats at once, or hedged, or not on the required line:
        each must score 0. Also empty, the prompt echoed, the bare number."""
        ref, bad = str(task.reference), str(int(task.reference) + 1)
        return (
            "",
            task.prompt[-1].content,
            ref,
            f"<answer>{ref}</answer>",
            f"The answer is {ref}.",
            f"Answer: {ref}\nAnswer: {bad}",
            f"Answer: {bad}\nAnswer: {ref}",
            f"Answer: {ref}\n{ref}\n<answer>{ref}</answer>",
            f"{ref}\n<answer>{ref}</answer>\nAnswer: {ref} or {bad}",
            f"Answer: {ref} or {bad}",
            f"Answer: {bad} {ref}",
            f"Answer: {ref}\nthat is all",
        )

    def audit(self, task: Task, completion: str) -> bool:
        """The result recomputed from the question, not the stored reference."""
        a, op, b = self._operands(task)
        got = final_answer(completion)
        return got is not None and int(got) == _apply(op, a, b)


register(ArithFormat())
