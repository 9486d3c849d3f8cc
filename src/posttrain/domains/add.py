"""add: integer addition; difficulty sets the operand sizes (2+1, 2+2, 3+3, 4+4 digits)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from posttrain.domains.base import ProceduralDomain, answer_cheats, extract_answer, question_match
from posttrain.domains.registry import register
from posttrain.types import Task

# digits of the two operands at each difficulty level (level 1 still has 900 questions)
SIZES = {1: (2, 1), 2: (2, 2), 3: (3, 3), 4: (4, 4)}


def operand(rng: random.Random, digits: int) -> int:
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


def operands(rng: random.Random, difficulty: int) -> tuple[int, int]:
    da, db = SIZES[difficulty]
    return operand(rng, da), operand(rng, db)


class Add(ProceduralDomain):
    name = "add"
    category = "arithmetic"
    description = "a+b; operand digits by level: 2+1, 2+2, 3+3, 4+4"
    levels = 4

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, str]:
        a, b = operands(rng, difficulty)
        return f"{a}+{b}=", str(a + b)

    def corrupt(self, answer: str) -> str:
        return str(int(answer) + 1)

    def cheats(self, task: Task) -> Sequence[str]:
        return answer_cheats(task, self.wrong(task))

    def audit(self, task: Task, completion: str) -> bool:
        """The sum recomputed from the question, not the stored reference."""
        a, b = (int(x) for x in question_match(task, r"\s*(\d+)\s*\+\s*(\d+)\s*=\s*").groups())
        return extract_answer(completion) == str(a + b)


register(Add())
