"""sub: integer subtraction with a non-negative result; operand digits by level 2-1, 2-2, 3-3, 4-4."""

from __future__ import annotations

import random
from collections.abc import Sequence

from posttrain.domains.add import operands
from posttrain.domains.base import ProceduralDomain, answer_cheats, extract_answer, question_match
from posttrain.domains.registry import register
from posttrain.types import Task


class Sub(ProceduralDomain):
    name = "sub"
    category = "arithmetic"
    description = "a-b with a >= b; operand digits by level: 2-1, 2-2, 3-3, 4-4"
    levels = 4

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, str]:
        a, b = sorted(operands(rng, difficulty), reverse=True)
        return f"{a}-{b}=", str(a - b)

    def corrupt(self, answer: str) -> str:
        return str(int(answer) + 1)

    def cheats(self, task: Task) -> Sequence[str]:
        return answer_cheats(task, self.wrong(task))

    def audit(self, task: Task, completion: str) -> bool:
        """The difference recomputed from the question, not the stored reference."""
        a, b = (int(x) for x in question_match(task, r"\s*(\d+)\s*-\s*(\d+)\s*=\s*").groups())
        return extract_answer(completion) == str(a - b)


register(Sub())
