"""mul: multiplication of a number of `difficulty` + 1 digits by a single digit."""

from __future__ import annotations

import random
from collections.abc import Sequence

from posttrain.domains.add import operand
from posttrain.domains.base import ProceduralDomain, answer_cheats, extract_answer, question_match
from posttrain.domains.registry import register
from posttrain.types import Task


class Mul(ProceduralDomain):
    name = "mul"
    category = "arithmetic"
    description = "a*d for a of `difficulty`+1 digits and one digit d"
    levels = 4

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, str]:
        a, d = operand(rng, difficulty + 1), rng.randint(0, 9)
        return f"{a}*{d}=", str(a * d)

    def corrupt(self, answer: str) -> str:
        return str(int(answer) + 1)

    def cheats(self, task: Task) -> Sequence[str]:
        return answer_cheats(task, self.wrong(task))

    def audit(self, task: Task, completion: str) -> bool:
        """The product recomputed from the question, not the stored reference."""
        a, b = (int(x) for x in question_match(task, r"\s*(\d+)\s*\*\s*(\d+)\s*=\s*").groups())
        return extract_answer(completion) == str(a * b)


register(Mul())
