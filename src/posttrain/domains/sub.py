"""sub: integer subtraction with a non-negative result; difficulty = digits."""
from __future__ import annotations

import random

from posttrain.domains.add import operand
from posttrain.domains.base import ProceduralDomain
from posttrain.domains.registry import register


class Sub(ProceduralDomain):
    name = "sub"
    category = "arithmetic"
    description = "a-b with a >= b, operands of `difficulty` digits"
    levels = 4

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, str]:
        a, b = sorted((operand(rng, difficulty), operand(rng, difficulty)), reverse=True)
        return f"{a}-{b}=", str(a - b)

    def corrupt(self, answer: str) -> str:
        return str(int(answer) + 1)


register(Sub())
