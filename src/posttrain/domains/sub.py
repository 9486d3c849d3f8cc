"""sub: integer subtraction with a non-negative result; operand digits by level 2-1, 2-2, 3-3, 4-4."""
from __future__ import annotations

import random

from posttrain.domains.add import operands
from posttrain.domains.base import ProceduralDomain
from posttrain.domains.registry import register


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


register(Sub())
