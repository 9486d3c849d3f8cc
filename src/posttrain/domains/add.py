"""add: integer addition; difficulty = number of digits of each operand."""
from __future__ import annotations

import random

from posttrain.domains.base import ProceduralDomain
from posttrain.domains.registry import register


def operand(rng: random.Random, digits: int) -> int:
    return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)


class Add(ProceduralDomain):
    name = "add"
    category = "arithmetic"
    description = "a+b for operands of `difficulty` digits"
    levels = 4

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, str]:
        a, b = operand(rng, difficulty), operand(rng, difficulty)
        return f"{a}+{b}=", str(a + b)

    def corrupt(self, answer: str) -> str:
        return str(int(answer) + 1)


register(Add())
