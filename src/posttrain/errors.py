"""One error module: a short hierarchy named by boundary, and blame by cause.

Invariant: infrastructure errors are never task failures. A rollout that
hits one is marked with its `kind`, retried or masked from the loss, and
counted; it is never scored 0. A failure the model's own output caused is
never masked: at a boundary where model output enters host code (an
environment step, a verifier, the execute stage, a user reward function)
`blame` attributes what escaped by its cause. A typed infra error
(SandboxError, GenerationError, VerifierError: a service or a check that
could not decide) and OSError, TimeoutError or MemoryError (a service or the
host) stay infra; anything else escaping while host code processed the
model's output is the model's (`ModelFault`, kind "model"): the sample is
scored 0 with the reason and counted, so a buggy check stays visible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ErrorKind = Literal[
    "config", "task", "prompt", "generation", "engine", "sandbox", "verifier", "trainer", "infra", "model"
]

NOT_RETRIED: tuple[ErrorKind, ...] = ("config", "task", "prompt", "model")
"""Kinds a retry cannot change: the same input fails the same way again."""


class PosttrainError(Exception):
    """Base of every error posttrain raises on purpose."""

    kind: ErrorKind = "infra"


class ConfigError(PosttrainError, ValueError):
    """Bad configuration: names the field and what is allowed."""

    kind: ErrorKind = "config"


class TaskError(PosttrainError, ValueError):
    """A malformed task file or an unknown domain."""

    kind = "task"


class GenerationError(PosttrainError):
    """The engine failed or timed out (infra, never reward 0)."""

    kind: ErrorKind = "generation"


class ServerUnavailable(GenerationError):
    """An inference server that could not be reached, dropped the connection, timed out or
    answered 5xx: the engine retries (restarting a server it owns), then raises it."""


class WeightSyncError(GenerationError):
    """A weight push the engine did not acknowledge (the load refused, a call timed out, the
    server gone): retried, then it stops the step; never a silent continue on old weights."""


class EngineFault(GenerationError):
    """An engine answered something no model can produce (token ids outside the vocabulary,
    impossible log-probs, lengths that do not agree, a weight version it was never sent;
    engine/validate.py), or its behaviour log-probs contradict the trainer's own far beyond the
    stated bound (engine/guard.py). Blamed on the infrastructure: the sample is masked with
    kind "engine", counted, and never scored or trained on; an engine that keeps doing it stops
    the run with this error."""

    kind: ErrorKind = "engine"


class SandboxError(PosttrainError):
    """The sandbox could not run a program (infra, never reward 0)."""

    kind = "sandbox"


class VerifierError(PosttrainError):
    """A verifier raised or could not decide (infra, never reward 0)."""

    kind = "verifier"


class ModelFault(PosttrainError):
    """The model's output made host code fail (a parser, a tool, an environment step,
    a reward function): the sample is scored, normally 0, with this reason; never
    retried, never masked."""

    kind = "model"


class PromptTooLong(ConfigError):
    """A prompt the engine can never take (as long as the model's positions or longer):
    the task's prompt, not the model's output and not a passing failure. Its group is
    masked with kind "prompt" and not retried; its engine batch-mates go on. A bad
    request to the engine, so a ConfigError to its callers (the server answers 400)."""

    kind = "prompt"


class TrainerError(PosttrainError):
    """A training step failed: non-finite loss, bad checkpoint, ..."""

    kind = "trainer"


class SyncVerificationError(PosttrainError):
    """After a weight push (and one re-push), the engine's log-probs of the sync probe differ
    from the trainer's own by more than the tolerance: the engine is not serving the policy
    just trained. It stops the run; its message carries both figures."""

    kind = "infra"


class ModelLoadError(PosttrainError, ValueError):
    """A model directory that cannot be loaded (missing weights, config)."""

    kind = "config"


INFRA_TYPES: tuple[type[BaseException], ...] = (TimeoutError, OSError, MemoryError)
"""Untyped exceptions that mean a service or the host failed, whatever the input."""


def classify(exc: BaseException) -> ErrorKind:
    """The kind of an exception that escaped code which does not process model output:
    a posttrain error keeps its own kind; anything else is infra."""
    if isinstance(exc, PosttrainError):
        return exc.kind
    return "infra"


def blame(exc: BaseException, boundary: ErrorKind = "infra") -> ErrorRecord:
    """The record of `exc` caught where host code processed the model's output: a posttrain
    error keeps its own kind; OSError, TimeoutError and MemoryError take the boundary's
    (infra) kind; anything else (a ValueError, OverflowError or RecursionError on what the
    model wrote) is the model's, kind "model"."""
    if isinstance(exc, (PosttrainError, *INFRA_TYPES)):
        return capture(exc, boundary)
    return ErrorRecord("model", _message(exc))


def _message(exc: BaseException) -> str:
    """`Type: text`, on one line and at most 500 characters (model-derived text can be huge)."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - an exception whose str() fails (e.g. int too large to print)
        text = "(no message)"
    line = f"{type(exc).__name__}: {text}".replace("\n", " ")
    return line if len(line) <= 500 else line[:497] + "..."


@dataclass(frozen=True)
class ErrorRecord:
    """What a boundary records for an exception that escaped the code it called:
    the typed kind and a one-line message (`Type: text`)."""

    kind: ErrorKind
    message: str


def capture(exc: BaseException, boundary: ErrorKind = "infra") -> ErrorRecord:
    """The record of `exc` caught at `boundary` around code that does not process the
    model's output (admission, an engine call, a whole worker call): an error posttrain
    raised on purpose keeps its own kind; anything else takes the boundary's kind. Catch
    sites around code that reads model output use `blame`."""
    kind = classify(exc)
    return ErrorRecord(boundary if kind == "infra" else kind, _message(exc))
