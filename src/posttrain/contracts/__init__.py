"""posttrain.contracts: the four contracts the parts implement, declared at the bottom of the
layers (above `types`, below every part), so a part imports the contract it implements and
never the part that uses it. Each is type-checked (mypy strict, pyproject); how to implement
one is in docs/extending.md.

    Engine, StreamingEngine, OnTokens   engine.py: generate, encode, update weights; declared capabilities
    Environment                         environment.py: reset, step, close (multi-turn)
    Verifier, ExecutingVerifier, ...    verifier.py: score, with a required label (name, version)
    Budget                              budget.py: per-episode turns, tokens, seconds
"""

from posttrain.contracts.budget import Budget
from posttrain.contracts.engine import Engine, OnTokens, StreamingEngine
from posttrain.contracts.environment import Environment
from posttrain.contracts.verifier import (
    CheapVerifier,
    ExecutingVerifier,
    ExecutionResult,
    Runner,
    Verifier,
    check_label,
    is_cheap,
    label,
)

__all__ = [
    "Budget",
    "CheapVerifier",
    "Engine",
    "Environment",
    "ExecutingVerifier",
    "ExecutionResult",
    "OnTokens",
    "Runner",
    "StreamingEngine",
    "Verifier",
    "check_label",
    "is_cheap",
    "label",
]
