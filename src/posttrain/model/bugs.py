"""Deliberately wrong solvers for the built-in domains.

The embedded base model is pretrained on a mix of correct answers and the
answers of these buggy solvers, so that it starts out systematically wrong
in ways a verifier can see and RL can fix. This is a property of the demo's
base model, stated in the README, not of RL in general.

Invariant: each bug is a deterministic function of the question text, and it
differs from the gold answer on most questions.
"""
from __future__ import annotations

import re
from collections.abc import Callable


def _operands(question: str) -> tuple[int, int]:
    a, b = re.findall(r"\d+", question)[:2]
    return int(a), int(b)


def add_subtracts(question: str) -> str:
    a, b = _operands(question)
    return str(abs(a - b))


def sub_adds(question: str) -> str:
    a, b = _operands(question)
    return str(a + b)


def mul_no_carry(question: str) -> str:
    a, d = _operands(question)
    return str(int("".join(str(int(x) * d % 10) for x in str(a))))


def _payload(question: str) -> str:
    return question.split(" ", 1)[1].rstrip("=")


def reverse_copy(question: str) -> str:
    return _payload(question)


def sort_descending(question: str) -> str:
    return "".join(sorted(_payload(question), reverse=True))


BUGS: dict[str, Callable[[str], str]] = {
    "add": add_subtracts,
    "sub": sub_adds,
    "mul": mul_no_carry,
    "reverse": reverse_copy,
    "sort": sort_descending,
}
