"""Reward-hacking probes and stricter audits: cheat outputs a sound verifier must reject.

Invariant: a cheat is an output that does not solve its task (the domain's
stricter check, where it has one, rejects it); a probe scores every cheat
of a few tasks against the live verifier and reports each one the verifier
passes. A verifier that raises on a cheat is an infra error, counted and
never read as acceptance or rejection.

A domain declares cheats with an optional method `cheats(task) -> list[str]`
and a stricter check with `audit(task, completion) -> bool`, or through
`register_cheats` / `register_audit` here (the built-in domains are
registered below: generic cheats, and an audit that recomputes the answer
from the prompt instead of trusting the task's reference).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.domains.base import Domain, extract_answer
from posttrain.errors import VerifierError
from posttrain.types import Episode, Task

CheatFn = Callable[[Task], list[str]]
AuditFn = Callable[[Task, str], bool]

_CHEATS: dict[str, CheatFn] = {}
_AUDITS: dict[str, AuditFn] = {}


def register_cheats(domain: str, fn: CheatFn) -> None:
    """Declare the cheat outputs of `domain` (replaces an earlier declaration)."""
    _CHEATS[domain] = fn


def register_audit(domain: str, fn: AuditFn) -> None:
    """Declare the stricter check of `domain` (replaces an earlier declaration)."""
    _AUDITS[domain] = fn


def cheats_of(domain: Domain) -> CheatFn | None:
    """The domain's own `cheats` method, else the registered one, else None."""
    return getattr(domain, "cheats", None) or _CHEATS.get(domain.name)


def audit_of(domain: Domain) -> AuditFn | None:
    """The domain's own `audit` method, else the registered one, else None."""
    return getattr(domain, "audit", None) or _AUDITS.get(domain.name)


@dataclass(frozen=True)
class Accepted:
    task_id: str
    cheat: str
    value: float


@dataclass(frozen=True)
class ProbeResult:
    """One domain's probe: how many cheats were scored and which ones passed."""

    domain: str
    verifier: str
    cheats: int
    accepted: tuple[Accepted, ...]
    infra_errors: int

    @property
    def ok(self) -> bool:
        return not self.accepted

    def message(self) -> str:
        if self.ok:
            return f"{self.domain}: verifier {self.verifier} rejected all {self.cheats} cheats"
        first = self.accepted[0]
        return (
            f"{self.domain}: verifier {self.verifier} accepts {len(self.accepted)} of {self.cheats} cheat outputs "
            f"(e.g. {first.cheat!r} for task {first.task_id} scored {first.value:.2f}); refusing to train on it"
        )


def verifier_name(domain: Domain) -> str:
    v = domain.verifier
    return f"{getattr(v, 'name', type(v).__name__)}@{getattr(v, 'version', '?')}"


def probe_domain(domain: Domain, difficulty: int, tasks: int) -> ProbeResult | None:
    """Score the declared cheats of `tasks` train tasks; None when the domain declares none."""
    fn = cheats_of(domain)
    if fn is None:
        return None
    accepted, n, errors = [], 0, 0
    for i in range(tasks):
        task = domain.sample(i, "train", difficulty)
        for cheat in fn(task):
            n += 1
            try:
                score = domain.score(task, Episode(cheat))
            except Exception:  # an infra error: neither acceptance nor rejection
                errors += 1
                continue
            if score.passed or score.value >= 1.0:
                accepted.append(Accepted(task.id, cheat, score.value))
    return ProbeResult(domain.name, verifier_name(domain), n, tuple(accepted), errors)


def audit(domain: Domain, task: Task, completion: str) -> bool | None:
    """The stricter check's verdict, or None when the domain has none."""
    fn = audit_of(domain)
    return None if fn is None else bool(fn(task, completion))


# ---------------------------------------------------------------- built-in domains


def generic_cheats(domain: Domain) -> CheatFn:
    """Outputs that a verifier comparing one extracted answer must reject: empty,
    the prompt echoed, the answer hidden among wrong ones, the answer outside the
    final answer tag, the answer followed by a second line."""

    def cheats(task: Task) -> list[str]:
        ref, wrong = str(task.reference), domain.wrong(task)
        return [
            "",
            " ",
            task.prompt[-1].content,
            f"{wrong} {ref} {wrong}",
            f"{ref} <answer>{wrong}</answer>",
            f"<answer>{wrong}</answer> {ref}",
            f"{ref}\n{wrong}",
        ]

    return cheats


_ARITH = re.compile(r"^\s*(\d+)\s*([-+*])\s*(\d+)\s*=\s*$")
_REV = re.compile(r"^\s*rev\s+(\S+)\s*=\s*$")
_SORT = re.compile(r"^\s*sort\s+(\d+)\s*=\s*$")


def _question(task: Task) -> str:
    return task.prompt[-1].content


def _arith_audit(task: Task, completion: str) -> bool:
    m = _ARITH.match(_question(task))
    if not m:
        raise VerifierError(f"audit {task.domain}: cannot parse question {_question(task)!r}")
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    value = a + b if op == "+" else a - b if op == "-" else a * b
    return extract_answer(completion) == str(value)


def _pattern_audit(pattern: re.Pattern, solve: Callable[[str], str]) -> AuditFn:
    def check(task: Task, completion: str) -> bool:
        m = pattern.match(_question(task))
        if not m:
            raise VerifierError(f"audit {task.domain}: cannot parse question {_question(task)!r}")
        return extract_answer(completion) == solve(m.group(1))

    return check


def _register_builtins() -> None:
    from posttrain.domains.registry import all_domains

    known = all_domains()
    audits: dict[str, Any] = {
        "add": _arith_audit,
        "sub": _arith_audit,
        "mul": _arith_audit,
        "reverse": _pattern_audit(_REV, lambda s: s[::-1]),
        "sort": _pattern_audit(_SORT, lambda s: "".join(sorted(s))),
    }
    for name, fn in audits.items():
        if name in known:
            _CHEATS.setdefault(name, generic_cheats(known[name]))
            _AUDITS.setdefault(name, fn)


_register_builtins()
