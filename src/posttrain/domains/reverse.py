"""reverse: reverse a string of letters; difficulty sets its length."""

from __future__ import annotations

import random
import string
from collections.abc import Sequence

from posttrain.domains.base import ProceduralDomain, answer_cheats, extract_answer, question_match
from posttrain.domains.registry import register
from posttrain.types import Task

LENGTHS = {1: (2, 3), 2: (3, 5), 3: (5, 7), 4: (7, 9)}


class Reverse(ProceduralDomain):
    name = "reverse"
    category = "strings"
    description = "reverse a lowercase string; length grows with difficulty"
    levels = 4

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, str]:
        text = "".join(rng.choices(string.ascii_lowercase[:12], k=rng.randint(*LENGTHS[difficulty])))
        return f"rev {text}=", text[::-1]

    def corrupt(self, answer: str) -> str:
        return answer[::-1] if answer != answer[::-1] else answer + "a"

    def cheats(self, task: Task) -> Sequence[str]:
        return answer_cheats(task, self.wrong(task))

    def audit(self, task: Task, completion: str) -> bool:
        """The string reversed from the question, not the stored reference."""
        text = question_match(task, r"\s*rev\s+(\S+)\s*=\s*").group(1)
        return extract_answer(completion) == text[::-1]


register(Reverse())
