"""Deliberately wrong solvers for the built-in domains (and the long-context families, read by position).

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


def read_by_position(family: str, strategies: tuple[str, ...]) -> Callable[[str], str]:
    """A long-context family (domains/_longctx.py) answered by position: the answer of the
    first of `strategies` the question offers (keychain: the first question's record), with
    the gold's answer line, so the base reads by position where the gold follows the chain."""

    def bug(question: str) -> str:
        from posttrain.domains._longctx import LongContextDomain
        from posttrain.domains.registry import get

        domain = get(family)
        if not isinstance(domain, LongContextDomain):
            raise TypeError(f"read_by_position: {family} is not a long-context family")
        given = domain.position_answers(question)
        return f"Answer: {next((given[s] for s in strategies if given.get(s)), '0')}"

    return bug


BUGS: dict[str, Callable[[str], str]] = {
    "add": add_subtracts,
    "sub": sub_adds,
    "mul": mul_no_carry,
    "reverse": reverse_copy,
    "sort": sort_descending,
    "keychain": read_by_position("keychain", ("first_question",)),
    "vartrack": read_by_position("vartrack", ("first_chain", "first_number")),
    "noisygraph": read_by_position("noisygraph", ("first_defined",)),
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


_FIX_SPEC = re.compile(r"spec:([a-z]+)\(x\)=x([+*])(\d+)")
_FIX_WANT = re.compile(r"want:(-?\d+)")


def code_fix_buggy(question: str, observation: str) -> str:
    """code_fix's buggy policy. Its first answer follows the spec (as the gold's does); after a
    failing visible test it does one of three things, by a hash of the question: resubmits the
    spec's code, ignoring the feedback (1/3); hard-codes the value the visible test wants,
    `return 27`, which passes only that test (1/3); or copies K wrongly from the message, digits
    reversed or off by one (1/3)."""
    from posttrain.domains.code_fix import answer, miscopy

    m = _FIX_SPEC.search(question)
    if m is None:
        return "done"
    name, op, spec = m.group(1), m.group(2), int(m.group(3))
    want = _FIX_WANT.search(observation)
    if want is None:
        return answer(name, op, spec)
    value = int(want.group(1))
    k = value  # the visible input is 0 for x+K and 1 for x*K, so the wanted value is K
    kind = hashlib.sha256(question.encode()).digest()[0] % 3
    if kind == 0:
        return answer(name, op, spec)
    if kind == 1:
        return f"def {name}(x):return {value}"
    return answer(name, op, miscopy(k))


def term_fix_buggy(question: str, observation: str) -> str:
    """term_fix's buggy policy: the first attempt is the gold one (the spec's value, then the
    checker); after the checker names another value, by a quarter of the questions each, it
    ignores the feedback and resubmits the spec's value, copies the checker's whole line into
    out, stops with `done`, or rewrites the checker to print ok."""
    spec = re.search(r"spec:(\d+)", question)
    first = f"echo {spec.group(1) if spec else 0} >out;./chk"
    failed = re.fullmatch(r"out:(.*)!=(\d+)", observation.strip())
    if not failed:
        return first
    kind = hashlib.sha256(question.encode()).digest()[0] % 4
    return (
        first,
        f"echo {observation.strip()} >out;./chk",
        "done",
        "echo echo ok>chk;./chk",
    )[kind]


def _printed_fields(question: str) -> dict[str, int]:
    body = question.split(":", 1)[1]
    return {k: int(v) for k, v in (pair.split("=", 1) for pair in body.split(","))}


def _render(fields: dict[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in fields.items())


def doc_fix_buggy(question: str, observation: str) -> str:
    """doc_fix's buggy policy: its first attempt copies the printed fields (as the gold does);
    after a reconciliation report (`tot_not_sum:N`) it errs one of four ways, chosen by the
    question's hash: resubmits the printed fields unchanged (ignores the report); changes the
    first item so that the printed total reconciles (the wrong field fixed, the validator
    satisfied); puts the reported sum in `tot` miscopied (digits reversed, or the last digit
    changed); or copies the report line itself. After any other observation it resubmits."""
    printed = _printed_fields(question)
    if "_not_sum:" not in observation:
        return _render(printed)
    reported = observation.rsplit(":", 1)[1]
    share = hashlib.sha256(question.encode()).digest()[0] % 4
    if share == 0:
        return _render(printed)
    if share == 1:
        first = next(iter(printed))
        forced = printed["tot"] - sum(v for k, v in printed.items() if k not in (first, "tot"))
        return _render({**printed, first: max(0, forced)})
    if share == 2:
        flipped = reported[::-1].lstrip("0") or "0"
        wrong = flipped if flipped != reported else reported[:-1] + str((int(reported[-1]) + 1) % 10)
        return _render({**printed, "tot": int(wrong)})
    return observation


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
TURN_BUGS: dict[str, TurnBug] = {
    "lookup": lookup_buggy,
    "code_fix": code_fix_buggy,
    "term_fix": term_fix_buggy,
    "doc_fix": doc_fix_buggy,
    "geo_fix": geo_fix_buggy,
}
