"""sort: sort a string of digits ascending; difficulty sets its length."""

from __future__ import annotations

import random
from collections.abc import Sequence

from posttrain.domains.base import ProceduralDomain, answer_cheats, extract_answer, question_match
from posttrain.domains.registry import register
from posttrain.domains.reverse import LENGTHS
from posttrain.types import Task


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

    def cheats(self, task: Task) -> Sequence[str]:
        return answer_cheats(task, self.wrong(task))

    def audit(self, task: Task, completion: str) -> bool:
        """The digits sorted from the question, not the stored reference."""
        digits = question_match(task, r"\s*sort\s+(\d+)\s*=\s*").group(1)
        return extract_answer(completion) == "".join(sorted(digits))


register(Sort())
