"""The Verifier contract: `score(task, episode) -> Score`, with a required label.

Invariant: every verifier a domain registers has a label, a non-empty `name` and
`version` (strings), checked once when the domain is registered (`check_label`); the
trace, the report, the probes and the judge checks name it `label(v)`, `name@version`,
and never guess one. Optional capabilities are declared as protocols of their own
(`ExecutingVerifier`, `CheapVerifier`) and checked with isinstance, never sniffed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from posttrain.types import Episode, Score, Task

Runner = Callable[[Any], Any]
"""Runs one sandbox ExecRequest and returns its ExecResult (the pipeline's pool, or
the process-wide one)."""


class ExecutionResult(Protocol):
    """What a domain's `execute` step returns: a frozen record the verifier reads
    (Episode.exec_result) and whose `summary()` (plain JSON data: status, exit
    code, cpu_s, wall_s, the program, per-test outcomes or the report, truncated
    output) goes into the trace row."""

    status: str

    def summary(self) -> dict[str, Any]: ...


class Verifier(Protocol):
    """The verifier contract: `score(task, episode) -> Score`, named and versioned (the trace
    and the report name it `name@version`, `label`). Deterministic and programmatic (a judge
    over a model is one too: byo/verifiers.py). Raises VerifierError when it cannot decide
    (the pipeline retries, then masks the sample); whatever the model's output causes is a
    score, normally 0 with a reason."""

    name: str
    version: str

    def score(self, task: Task, episode: Episode) -> Score: ...


@runtime_checkable
class ExecutingVerifier(Protocol):
    """A verifier that declares an execute step (its domain then `executes`): one sandbox run
    through `run` (None: the process-wide pool) whose typed result the verifier reads as
    Episode.exec_result; None when nothing runs. Raises SandboxError when the sandbox, not
    the program, failed."""

    def execute(self, task: Task, completion: str, run: Runner | None = None) -> ExecutionResult | None: ...


@runtime_checkable
class CheapVerifier(Protocol):
    """A verifier that declares whether it scores in process in microseconds, with no I/O
    (`cheap` True: the pipeline may call it in the event loop's thread, pipeline/direct.py)."""

    cheap: bool


def is_cheap(verifier: object) -> bool:
    """Whether `verifier` declares itself cheap (`CheapVerifier` with `cheap` True)."""
    return isinstance(verifier, CheapVerifier) and bool(verifier.cheap)


def check_label(verifier: object, owner: str) -> None:
    """TypeError naming `owner` (the domain) and what is missing when `verifier` has no label: a
    non-empty string `name` and `version` and a callable `score` (the Verifier contract)."""
    missing = [
        m for m in ("name", "version") if not isinstance(getattr(verifier, m, None), str) or not getattr(verifier, m)
    ]
    if not callable(getattr(verifier, "score", None)):
        missing.append("score")
    if missing:
        raise TypeError(
            f"{owner}: its verifier {type(verifier).__name__} has no {'/'.join(missing)} (the Verifier contract: "
            "a non-empty string name and version, and score(task, episode) -> Score)"
        )


def label(verifier: Verifier) -> str:
    """The verifier's label as the trace and the report write it: `name@version`."""
    return f"{verifier.name}@{verifier.version}"
