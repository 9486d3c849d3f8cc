"""The episode driver (`pipeline.play.play` over `envs.driver`): first observation in the prompt, turns through the
chat template, loss only on the model's tokens, turns recorded with parts and exec_result."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "pipeline"))
from pipeline_testlib import ScriptedEngine  # noqa: E402

from posttrain.domains import registry  # noqa: E402
from posttrain.domains.base import Budget, Domain  # noqa: E402
from posttrain.envs import StepResult  # noqa: E402
from posttrain.errors import SandboxError  # noqa: E402
from posttrain.pipeline.play import play  # noqa: E402
from posttrain.types import Message, SamplingParams, Score, Task, TaskMeta  # noqa: E402


class Lookup:
    """The answer is only in the first observation; 'check' actions get the digit count back."""

    fail_steps = 0
    closed = 0

    def reset(self, task):
        self.key = task.reference
        return f"secret={self.key}"

    def step(self, action):
        if Lookup.fail_steps:
            Lookup.fail_steps -= 1
            raise SandboxError("sandbox worker died")
        if action.startswith("answer "):
            ok = action.split()[-1] == self.key
            return StepResult("recorded", True, {"process": 1.0}, {"answered": ok})
        return StepResult(f"unknown action {action!r}", False, {"process": 0.0})

    def close(self):
        Lookup.closed += 1


class LookupVerifier:
    name, version = "lookup", "1"

    def score(self, task, episode):
        ok = episode.completion == f"answer {task.reference}"
        return Score(float(ok), {"outcome": float(ok)}, ok)


class LookupDomain(Domain):
    name, category, budget = "test_lookup", "test", Budget(turns=3, tokens=40)
    verifier = LookupVerifier()

    def sample(self, index, split, difficulty):
        return Task(
            f"lk:{index}",
            self.name,
            (Message("user", "Read the secret, then answer it."),),
            str(100 + index),
            TaskMeta(split, 1, "test", "1"),
        )

    def gold(self, task):
        return f"answer {task.reference}"

    def wrong(self, task):
        return "answer 0"

    def environment(self):
        return Lookup


@pytest.fixture
def lookup(monkeypatch):
    dom = LookupDomain()
    monkeypatch.setitem(registry._REGISTRY, dom.name, dom)
    Lookup.fail_steps, Lookup.closed = 0, 0
    return dom


def policy(context: str, j: int) -> str:
    """Copies the secret when it saw it; sample 1 wastes its first turn."""
    if j == 1 and "<|tool|>unknown" not in context:
        return "look around"
    secret = context.split("secret=")[1].split("<|")[0] if "secret=" in context else "?"
    return f"answer {secret}"


def test_first_observation_is_in_the_prompt_and_turns_are_recorded(lookup):
    task = lookup.sample(7, "train", 1)
    [group] = play(ScriptedEngine(policy), [task], SamplingParams(max_tokens=40), n=2)
    first, second = group
    assert first.turns == 1 and first.episode.completion == "answer 107" and first.error is None
    assert first.episode.turns[0].parts == {"process": 1.0}
    assert first.episode.exec_result == {"answered": True}  # the last turn's exec_result
    assert second.turns == 2 and [t.action for t in second.episode.turns] == ["look around", "answer 107"]
    assert second.episode.turns[0].observation == "unknown action 'look around'"
    assert lookup.score(task, second.episode).passed
    assert Lookup.closed == 2


def test_only_the_models_tokens_carry_loss(lookup):
    engine = ScriptedEngine(policy)
    task = lookup.sample(3, "train", 1)
    [[_, second]] = play(engine, [task], SamplingParams(max_tokens=40), n=2)
    c, mask = second.completion, second.loss_mask
    assert len(mask) == len(c.token_ids) == len(c.logprobs)
    model = "".join(engine.decode([i]) for i, m in zip(c.token_ids, mask) if m)
    env = "".join(engine.decode([i]) for i, m in zip(c.token_ids, mask) if not m)
    assert model == "look aroundanswer 103"
    assert env == "<|tool|>unknown action 'look around'<|assistant|>"  # the chat template's rendering
    assert all(lp == 0.0 for lp, m in zip(c.logprobs, mask) if not m)
    assert engine.decode(c.prompt_ids).endswith("<|tool|>secret=103<|assistant|>")


def test_turn_budget_ends_the_episode(lookup):
    task = lookup.sample(0, "train", 1)
    [[p]] = play(ScriptedEngine(lambda c, j: "look around"), [task], SamplingParams(max_tokens=40))
    assert p.turns == 3 and not lookup.score(task, p.episode).passed


def test_a_sandbox_fault_is_retried_then_masked_never_scored(lookup):
    Lookup.fail_steps = 2
    [[p]] = play(ScriptedEngine(policy), [lookup.sample(1, "train", 1)], SamplingParams(max_tokens=40), retries=2)
    assert p.error is None and p.episode.completion == "answer 101"
    Lookup.fail_steps = 10
    [[p]] = play(ScriptedEngine(policy), [lookup.sample(1, "train", 1)], SamplingParams(max_tokens=40), retries=2)
    assert p.error == "sandbox"


def test_the_episodes_of_a_wave_take_their_turns_together_one_engine_call_a_turn(lookup):
    """Evaluation's inline scheduler plays episode groups in lockstep: five tasks whose second
    sample needs two turns cost two engine calls (five groups each), not one call per group turn."""

    class Counting(ScriptedEngine):
        sizes: list[int] = []

        def generate(self, requests):
            self.sizes.append(len(requests))
            return super().generate(requests)

    engine = Counting(policy)
    tasks = [lookup.sample(i, "eval", 1) for i in range(5)]
    groups = play(engine, tasks, SamplingParams(max_tokens=40), n=2)
    assert engine.sizes == [5, 5]  # turn 1: every group; turn 2: the groups whose sample 1 looked around
    assert [[p.episode.completion for p in g] for g in groups] == [[f"answer {100 + i}"] * 2 for i in range(5)]
    assert [[p.turns for p in g] for g in groups] == [[1, 2]] * 5


def test_train_from_turn_two_leaves_the_first_attempt_as_context(lookup):
    """Budget.train_from 2 (tasks.domains.X.train_from_turn): the first action is kept with mask
    0 (its tokens and behaviour log-probs unchanged), later actions carry the loss; a derived
    task whose prompt holds a turn already (`TaskMeta.branched`) trains from its first action."""
    engine = ScriptedEngine(policy)
    task = lookup.sample(3, "train", 1)
    budget = {lookup.name: Budget(turns=3, tokens=40, train_from=2)}
    [[one, two]] = play(engine, [task], SamplingParams(max_tokens=40), n=2, budgets=budget)
    [[_, base]] = play(ScriptedEngine(policy), [task], SamplingParams(max_tokens=40), n=2)
    assert two.completion == base.completion and two.turns == 2  # the same episode, only the mask differs
    trained = "".join(engine.decode([i]) for i, m in zip(two.completion.token_ids, two.loss_mask) if m)
    assert trained == "answer 103"  # the revision only; "look around" (turn 1) is context
    dropped = [i for i, a, b in zip(two.completion.token_ids, base.loss_mask, two.loss_mask) if a and not b]
    assert engine.decode(dropped).startswith("look around") and "answer" not in engine.decode(dropped)
    assert one.turns == 1 and not any(one.loss_mask)  # passed at turn 1: nothing of its own to train
    derived = dataclasses.replace(task, meta=dataclasses.replace(task.meta, branched=1))
    [[d1, _]] = play(ScriptedEngine(policy), [derived], SamplingParams(max_tokens=40), n=2, budgets=budget)
    assert d1.turns == 1 and all(d1.loss_mask)


def test_train_from_turn_past_the_turn_budget_is_a_config_error(lookup):
    from posttrain.configs.tasks import DomainSpec
    from posttrain.domains.base import domain_budget
    from posttrain.errors import ConfigError

    assert domain_budget(lookup, DomainSpec(train_from_turn=2)).train_from == 2
    assert domain_budget(lookup, None).train_from == 1
    with pytest.raises(ConfigError, match="train_from_turn: 3 is past the domain's 2 turn"):
        domain_budget(lookup, DomainSpec(max_turns=2, train_from_turn=3))
