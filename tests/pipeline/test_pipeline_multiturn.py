"""Multi-turn episodes through the pipeline: the coding loop (real sandbox) and the tool loop."""
from __future__ import annotations

import asyncio
import re

import pytest
from pipeline_testlib import ScriptedEngine

from posttrain.domains import registry
from posttrain.domains.base import Budget, Domain
from posttrain.envs import CodingEnv, ToolEnv, ToolSpec, script_judge
from posttrain.pipeline import EmbeddedWorkers, Pipeline, PipelineConfig, Scheduler
from posttrain.trainer.batch import TrainRow
from posttrain.types import Message, SamplingParams, Score, Task, TaskMeta

TESTS = """from solution import f
for x in (2, 3, 5):
    got = f(x)
    assert got == x * {k}, f"f({{x}}) returned {{got!r}}, expected {{x * {k}}}"
"""


class PassedVerifier:
    name, version = "final_attempt", "1"

    def score(self, task, episode):
        ok = bool(episode.exec_result and episode.exec_result.passed)
        return Score(1.0 if ok else 0.0, {"outcome": float(ok)}, ok)


class FixCode(Domain):
    name, category, budget = "test_fixcode", "test", Budget(turns=3, tokens=200)
    verifier = PassedVerifier()

    def sample(self, index, split, difficulty):
        k = 2 + index % 7
        return Task(
            f"fix:{index}",
            self.name,
            (Message("user", f"Write f(x) returning x times the hidden k (index {index})."),),
            {"tests": TESTS.format(k=k)},
            TaskMeta(split, 1, "test", "1"),
        )

    def gold(self, task):
        return ""

    def wrong(self, task):
        return ""

    def environment(self):
        return lambda: CodingEnv(script_judge(), turn_cost=0.0)


def coding_policy(context: str, j: int) -> str:
    """Reads the last error: an expected value gives the factor, a NameError the fix."""
    expected = re.findall(r"f\((\d+)\) returned .*?, expected (\d+)", context)
    if expected:
        x, want = map(int, expected[-1])
        return f"```python\ndef f(x):\n    return x * {want // x}\n```"
    if "NameError" in context or j % 2 == 0:
        return "```python\ndef f(x):\n    return x * 1\n```"
    return "```python\ndef f(x):\n    return x * factor\n```"


def _run(domain, policy, tasks, n=4):
    cfg = PipelineConfig(execute_workers=2)
    sched = Scheduler(cfg, {domain.name: 1.0}, {domain.name: "short"})

    async def go():
        async with Pipeline(
            cfg, EmbeddedWorkers(ScriptedEngine(policy)), SamplingParams(n=n, max_tokens=200), sched, seed=1
        ) as p:
            return await p.run_groups(tasks), p.stats()

    return asyncio.run(go())


@pytest.fixture
def fixcode(monkeypatch):
    dom = FixCode()
    monkeypatch.setitem(registry._REGISTRY, dom.name, dom)
    return dom


def test_coding_loop_pass_rate_rises_over_turns(fixcode):
    tasks = [fixcode.sample(i, "train", 1) for i in range(4)]
    results, stats = _run(fixcode, coding_policy, tasks)
    rollouts = [r for g in results for r in g.rollouts]
    assert len(rollouts) == 16 and all(r.error is None for r in rollouts)
    # pass rate by turn, from each episode's attempts (an episode that passed stops, so it stays passed)
    by_turn = []
    for t in range(3):
        by_turn.append(sum(_attempt_passed(r, t) for r in rollouts) / len(rollouts))
    assert by_turn == [0.0, 0.5, 1.0]
    assert any("NameError" in a.feedback for r in rollouts for a in r.exec_result.attempts)
    assert all(r.reward == 1.0 for r in rollouts)
    assert stats.counters["finished"] == 4


def _attempt_passed(rollout, turn: int) -> bool:
    attempts = rollout.exec_result.attempts  # CodingOutcome: every sandboxed attempt, in order
    return attempts[min(turn, len(attempts) - 1)].passed  # an episode that passed stopped there


def test_coding_loop_loss_mask_covers_only_model_tokens(fixcode):
    engine = ScriptedEngine(coding_policy)
    [group], _ = _run(fixcode, coding_policy, [fixcode.sample(1, "train", 1)], n=2)
    for r in group.rollouts:
        ids, mask = r.completion.token_ids, r.loss_mask
        assert mask is not None and len(mask) == len(ids) == len(r.completion.logprobs)
        model_text = engine.decode([i for i, m in zip(ids, mask) if m])
        env_text = engine.decode([i for i, m in zip(ids, mask) if not m])
        assert "def f(x)" in model_text and "Tests failed" not in model_text
        assert "Tests failed" in env_text and "def f" not in env_text
        assert all(lp == 0.0 for lp, m in zip(r.completion.logprobs, mask) if not m)
        row = TrainRow.from_completion(r.completion, r.reward, r.group_id, 1.0, r.loss_mask)
        assert row.n_loss_tokens == sum(mask) < len(ids)


LOOKUP = ToolSpec("lookup", "Value stored under a key.", {"key": "string"}, ("key",))


class ToolVerifier:
    name, version = "tool_answer", "1"

    def score(self, task, episode):
        out = episode.exec_result
        ok = out is not None and out.answer == task.reference
        protocol = out.compliance if out is not None else 0.0
        return Score(0.5 * float(ok) + 0.5 * protocol, {"outcome": float(ok), "protocol": protocol}, ok)


class ToolWorld(Domain):
    name, category, budget = "test_toolworld", "test", Budget(turns=4, tokens=200)
    verifier = ToolVerifier()

    def sample(self, index, split, difficulty):
        return Task(f"tool:{index}", self.name, (Message("user", "What is stored under key a?"),), "42",
                    TaskMeta(split, 1, "test", "1"))

    def gold(self, task):
        return ""

    def wrong(self, task):
        return ""

    def environment(self):
        return lambda: ToolEnv({"lookup": (LOOKUP, lambda key: {"a": "42"}[key])})


def tool_policy(context: str, j: int) -> str:
    if "returned" in context or "<|tool|>42" in context:
        return '{"tool": "answer", "arguments": {"value": "42"}}'
    if "protocol error" in context:
        return '<tool_call>{"tool": "lookup", "arguments": {"key": "a"}}</tool_call>'
    return ["lookup a please", '{"tool": "search", "arguments": {}}', '{"tool": "lookup", "arguments": {"key": 1}}',
            '{"tool": "lookup", "arguments": {"key": "a"}}'][j % 4]


def test_tool_loop_records_protocol_violations(monkeypatch):
    dom = ToolWorld()
    monkeypatch.setitem(registry._REGISTRY, dom.name, dom)
    [group], _ = _run(dom, tool_policy, [dom.sample(0, "train", 1)], n=4)
    parts = [r.score.parts for r in group.rollouts]
    assert all(p["outcome"] == 1.0 for p in parts)
    # samples 0-2 broke the protocol once (malformed JSON, unknown tool, mistyped argument); sample 3 never did
    assert [p["protocol"] for p in parts] == [pytest.approx(2 / 3)] * 3 + [1.0]
    assert [r.timings["turns"] for r in group.rollouts] == [3.0, 3.0, 3.0, 2.0]


def test_tool_env_violation_kinds():
    env = ToolEnv({"lookup": (LOOKUP, lambda key: "v")})
    env.reset(ToolWorld().sample(0, "train", 1))
    assert env.step("not json")[0].startswith("protocol error: malformed")
    assert "unknown tool" in env.step('{"tool": "rm", "arguments": {}}')[0]
    assert "missing" in env.step('{"tool": "lookup", "arguments": {}}')[0]
    assert "must be string" in env.step('{"tool": "lookup", "arguments": {"key": 3}}')[0]
    assert env.step('{"tool": "lookup", "arguments": {"key": "k"}}') == ("v", False)
    assert env.step('{"tool": "answer", "arguments": {"value": "v"}}') == ("answer recorded", True)
    out = env.outcome()
    assert out.calls == 6 and len(out.violations) == 4 and out.answer == "v"


class _FlakyToolEnv(ToolEnv):
    made = 0

    def __init__(self):
        super().__init__({"lookup": (LOOKUP, lambda key: {"a": "42"}[key])})
        type(self).made += 1
        self.flaky = type(self).made == 2
        self.steps = 0
        self.all = getattr(type(self), "all", [])
        self.all.append(self)

    def step(self, action):
        if self.flaky:
            self.flaky = False
            from posttrain.errors import SandboxError

            raise SandboxError("environment worker died")
        self.steps += 1
        return super().step(action)


def test_environment_infra_error_retries_only_unstepped_trajectories(monkeypatch):
    dom = ToolWorld()
    monkeypatch.setattr(dom, "environment", lambda: _FlakyToolEnv)
    monkeypatch.setitem(registry._REGISTRY, dom.name, dom)
    _FlakyToolEnv.made, _FlakyToolEnv.all = 0, []
    [group], stats = _run(dom, tool_policy, [dom.sample(0, "train", 1)], n=4)
    assert stats.counters["retries"] == 1 and stats.counters["masked_groups"] == 0
    assert [r.timings["turns"] for r in group.rollouts] == [3.0, 3.0, 3.0, 2.0]
    # one environment per sample (the first is made at admission), and no action was stepped twice
    assert [e.steps for e in _FlakyToolEnv.all] == [3, 3, 3, 2]


def test_environment_that_cannot_start_masks_its_group(monkeypatch):
    dom = ToolWorld()

    class Broken:
        def reset(self, task):
            raise OSError("tool server unreachable")

        def step(self, action):
            raise AssertionError("never stepped")

    monkeypatch.setattr(dom, "environment", lambda: Broken())
    monkeypatch.setitem(registry._REGISTRY, dom.name, dom)
    [group], stats = _run(dom, tool_policy, [dom.sample(0, "train", 1)], n=2)
    assert stats.counters["masked_groups"] == 1
    assert all(r.reward is None and "tool server unreachable" in r.error for r in group.rollouts)
