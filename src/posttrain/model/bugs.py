"""Deliberately wrong solvers for the built-in domains.

The embedded base model is pretrained on a mix of correct answers and the
answers of these buggy solvers, so that it starts out systematically wrong
in ways a verifier can see and RL can fix. This is a property of the demo's
base model, stated in the README, not of RL in general.

Invariant: each bug is a deterministic function of the question text, and it
differs from the gold answer on most questions. A multi-turn bug (`TURN_BUGS`)
is a buggy policy: a deterministic function of the question and the last
observation that gives the next action.
"""

from __future__ import annotations

import hashlib
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


def _lookup_key(question: str) -> str:
    return question.split(":", 1)[1].rstrip("?")


def lookup_buggy(question: str, observation: str) -> str:
    """lookup's buggy policy: on half the questions it ignores the tool and answers a
    made-up number at once; on the others it looks the key up and copies the value reversed."""
    key = _lookup_key(question)
    digest = hashlib.sha256(question.encode()).digest()
    if digest[0] % 2 == 0:
        return str(100 + int.from_bytes(digest[1:3], "big") % 900)
    if "=" not in observation:
        return f"look:{key}"
    return observation.split("=", 1)[1][::-1]


_GEO_ITEM = re.compile(r"([wdh]):(\d+)([<>])(\d+)(,min:\d+)?")


def geo_fix_buggy(question: str, observation: str) -> str:
    """geo_fix's buggy policy. Turn 1 builds the prompt's spec (as the gold does); after a
    report it does one of four wrong things, a quarter of the questions each: resubmits the
    spec (ignores the report); puts the slot's size into the next dimension (the wrong one);
    never stops (on a report with a minimum wall it builds the slot's size anyway, else it
    revises like the gold); stops after any failure (right on infeasible tasks only)."""
    spec = [int(x) for x in re.findall(r"\d+", question)[:3]]
    first = "box:" + ",".join(map(str, spec))
    items = _GEO_ITEM.findall(observation)
    if not observation or len(spec) != 3:
        return first
    mode = hashlib.sha256(question.encode()).digest()[0] % 4
    if mode == 0 or not items:
        return first
    if mode == 3:
        return "stop"
    dims = list(spec)
    for axis, _, _, slot, _ in items:
        k = "wdh".index(axis)
        dims[(k + 1) % 3 if mode == 1 else k] = int(slot)
    return "box:" + ",".join(map(str, dims))


TurnBug = Callable[[str, str], str]
TURN_BUGS: dict[str, TurnBug] = {"lookup": lookup_buggy, "geo_fix": geo_fix_buggy}
