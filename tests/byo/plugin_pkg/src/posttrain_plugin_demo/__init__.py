"""A posttrain plugin in one file: the domain `plug_double` (double a number, in the `a+a=`
form the embedded model knows) and the verifier `last_digit` (the answer's last digit)."""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict

from posttrain.domains.base import ProceduralDomain
from posttrain.types import Episode, Score, Task


class Double(ProceduralDomain):
    name = "plug_double"
    category = "plugin"
    description = "a+a= for a two-digit a (from a plugin package)"

    def generate(self, rng: random.Random, difficulty: int) -> tuple[str, str]:
        a = rng.randint(10, 99)
        return f"{a}+{a}=", str(2 * a)


class LastDigit:
    """Passes when the answer's last character equals the reference's last digit."""

    name = "last_digit"
    version = "1"

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        strict: bool = True

    def __init__(self, params: LastDigit.Params) -> None:
        self.params = params

    def score(self, task: Task, episode: Episode) -> Score:
        got, ref = episode.completion.strip(), str(task.reference)
        ok = bool(got) and got[-1] == ref[-1]
        return Score(float(ok), {"outcome": float(ok)}, ok, "" if ok else "wrong last digit")
