"""sort: sort a string of digits ascending; difficulty sets its length."""
from __future__ import annotations

import random

from posttrain.domains.base import ProceduralDomain
from posttrain.domains.registry import register
from posttrain.domains.reverse import LENGTHS


class Sort(ProceduralDomain):
    name = "sort"
    category = "strings"
    description = "sort digits ascending; length grows with difficulty"
    levels = 4

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, str]:
        digits = "".join(rng.choices("0123456789", k=rng.randint(*LENGTHS[difficulty])))
        return f"sort {digits}=", "".join(sorted(digits))

    def corrupt(self, answer: str) -> str:
        return answer[::-1] if answer != answer[::-1] else answer + "0"


register(Sort())
