"""The Environment contract: one multi-turn world, reset per task and stepped per action.

Invariant: an environment's observations enter the model's context with loss mask 0 (the
driver, envs/driver.py, keeps the ledger); a malformed action is an observation, never an
exception; SandboxError is the infrastructure's (retried, then masked), any other exception
a step raises is the model's (scored 0 with the reason). `make_environment` (envs/base.py)
checks what a domain makes against this contract once, naming a missing member.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from posttrain.types import StepResult, Task


@runtime_checkable
class Environment(Protocol):
    """A multi-turn world (checked once per environment made: `make_environment`). `reset`
    starts an episode for a task and returns the first observation ("" for none), which
    the driver puts in the prompt (a "tool" message after the task's messages) before the
    first generation. `step` takes the model's action; a malformed action is an observation,
    never an exception; SandboxError means the sandbox failed (the driver
    retries, then masks and counts the episode; never reward 0). Any other
    exception a step raises on an action is the model's (`errors.blame`): the
    driver ends that episode as a model fault, scored 0 with the reason. A step may show
    images with its observation (`StepResult.images`: a zoomed crop, a re-render); the
    driver puts them on the observation's tool message, so every later turn's context holds
    them (only a vision model's hf engine reads them; every other engine refuses them). The
    first observation is text only."""

    def reset(self, task: Task) -> str: ...

    def step(self, action: str) -> StepResult: ...

    def close(self) -> None: ...
