"""mul: multiplication of a number of `difficulty` + 1 digits by a single digit."""
from __future__ import annotations

import random

from posttrain.domains.add import operand
from posttrain.domains.base import ProceduralDomain
from posttrain.domains.registry import register


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


register(Mul())
