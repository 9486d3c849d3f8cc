"""One error module: a short hierarchy named by boundary.

Invariant: infrastructure errors are never task failures. A rollout that
hits one is marked with its `kind`, retried or masked from the loss, and
counted; it is never scored 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ErrorKind = Literal["config", "task", "generation", "sandbox", "verifier", "trainer", "infra"]


class PosttrainError(Exception):
    """Base of every error posttrain raises on purpose."""

    kind: ErrorKind = "infra"


class ConfigError(PosttrainError, ValueError):
    """Bad configuration: names the field and what is allowed."""

    kind = "config"


class TaskError(PosttrainError, ValueError):
    """A malformed task file or an unknown domain."""

    kind = "task"


class GenerationError(PosttrainError):
    """The engine failed or timed out (infra, never reward 0)."""

    kind = "generation"


class SandboxError(PosttrainError):
    """The sandbox could not run a program (infra, never reward 0)."""

    kind = "sandbox"


class VerifierError(PosttrainError):
    """A verifier raised or could not decide (infra, never reward 0)."""

    kind = "verifier"


class TrainerError(PosttrainError):
    """A training step failed: non-finite loss, bad checkpoint, ..."""

    kind = "trainer"


class ModelLoadError(PosttrainError, ValueError):
    """A model directory that cannot be loaded (missing weights, config)."""

    kind = "config"


def classify(exc: BaseException) -> ErrorKind:
    """The boundary an exception escaped from; unknown ones are infra."""
    if isinstance(exc, PosttrainError):
        return exc.kind
    if isinstance(exc, (TimeoutError, OSError, MemoryError)):
        return "infra"
    return "infra"


@dataclass(frozen=True)
class ErrorRecord:
    """What a boundary records for an exception that escaped the code it called:
    the typed kind and a one-line message (`Type: text`)."""

    kind: ErrorKind
    message: str


def capture(exc: BaseException, boundary: ErrorKind = "infra") -> ErrorRecord:
    """The record of `exc` caught at `boundary` (the one helper every catch site of a
    rollout uses): an error posttrain raised on purpose keeps its own kind; anything
    else takes the boundary's kind, so a KeyError escaping a verifier is a verifier
    error, never a wrong answer."""
    kind = classify(exc)
    return ErrorRecord(boundary if kind == "infra" else kind, f"{type(exc).__name__}: {exc}")
