"""The contracts are declared at the bottom of the layers and checked, not sniffed: an
environment that lacks a member of the Environment protocol is refused at once, naming it;
a verifier's optional capabilities (an execute step, being cheap) are declared protocols."""

from __future__ import annotations

import pytest

from posttrain.domains.base import ExactMatch, ExecutingVerifier, ProceduralDomain, is_cheap
from posttrain.envs.base import Environment, make_environment
from posttrain.types import Score, StepResult


class Sums(ProceduralDomain):
    name, category = "test_contract_sums", "test"

    def generate(self, rng, difficulty):
        return f"{rng.randint(0, 9)}+{rng.randint(0, 9)}=", "0"


class Whole:
    def reset(self, task):
        return "hello"

    def step(self, action):
        return StepResult("ok", done=True)

    def close(self):
        pass


class NoStep:
    def reset(self, task):
        return ""

    def close(self):
        pass


def test_an_environment_missing_a_member_is_refused_naming_it():
    dom = Sums()
    dom.environment = lambda: NoStep
    with pytest.raises(TypeError, match=r"NoStep, which has no step \(the Environment contract"):
        make_environment(dom)
    dom.environment = lambda: Whole  # a class: made fresh each time
    made = make_environment(dom)
    assert isinstance(made, Whole) and isinstance(made, Environment) and made is not make_environment(dom)


class Runs:
    name, version = "runs", "1"

    def score(self, task, episode):
        return Score(1.0 if episode.exec_result == "ran" else 0.0, passed=episode.exec_result == "ran")

    def execute(self, task, completion, run=None):
        return "ran"


class Slow(ExactMatch):
    cheap = False


def test_verifier_capabilities_are_declared_protocols():
    dom, task = Sums(), Sums().sample(0, "train", 1)
    assert not dom.executes and dom.execute(task, "0") is None and is_cheap(dom.verifier)  # ExactMatch
    dom.verifier = Runs()
    assert isinstance(dom.verifier, ExecutingVerifier) and dom.executes and dom.execute(task, "0") == "ran"
    assert not is_cheap(dom.verifier)  # it does not declare itself cheap
    dom.verifier = Slow()
    assert not is_cheap(dom.verifier) and not dom.executes
