"""An example posttrain plugin: one domain and one verifier, found through entry points.

- `ex_double` (entry point group `posttrain.domains`): `a+a=` for a two-digit a, a format the
  embedded model knows, so it trains out of the box.
- `digits_close` (group `posttrain.verifiers`): graded credit for the share of the reference's
  digits the answer gets right, position by position; `Params` validates its parameters.

`score` of a verifier runs in the trainer's verification threads: keep it pure and quick, and
raise for a verdict you cannot reach (an infra error, masked and counted) instead of returning 0.
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from posttrain.domains.base import ProceduralDomain, extract_answer
from posttrain.types import Episode, Score, Task


class Double(ProceduralDomain):
    name = "ex_double"
    category = "plugin"
    description = "a+a= for a two-digit a (example plugin)"

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, str]:
        a = rng.randint(10, 99)
        return f"{a}+{a}=", str(2 * a)


class DigitsClose:
    """Share of the reference's digits matched position by position; passes at `pass_at`."""

    name = "digits_close"
    version = "1"

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        pass_at: float = Field(1.0, ge=0.0, le=1.0)

    def __init__(self, params: DigitsClose.Params) -> None:
        self.params = params

    def score(self, task: Task, episode: Episode) -> Score:
        ref, got = str(task.reference), extract_answer(episode.completion)
        hits = sum(a == b for a, b in zip(ref, got)) if len(got) == len(ref) else 0
        value = hits / len(ref) if ref else 0.0
        return Score(value, {"outcome": value}, value >= self.params.pass_at, "" if value == 1.0 else "digits differ")


def close_enough(completion: str, answer: str) -> float:
    """A reward function by import path (`verifier: posttrain_example_plugin:close_enough`):
    1 for the exact answer, 0.5 when it is off by one, else 0."""
    try:
        diff = abs(int(extract_answer(completion)) - int(answer))
    except ValueError:
        return 0.0
    return 1.0 if diff == 0 else 0.5 if diff == 1 else 0.0
