"""Multi-turn episodes through the pipeline (envs.driver): a coding loop on the real sandbox and a
lookup world, both small Environments defined here."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time

import pytest
from pipeline_testlib import ScriptedEngine

from posttrain.configs.pipeline import PipelineConfig
from posttrain.domains import registry
from posttrain.domains.base import Budget, Domain
from posttrain.envs import StepResult, script_judge
from posttrain.envs.coding import extract_code
from posttrain.errors import SandboxError
from posttrain.pipeline import EmbeddedWorkers, Pipeline, Scheduler
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


@dataclasses.dataclass(frozen=True)
class AttemptRun:
    """One turn's sandbox run, as an execution result the trace summarises."""

    program: str
    passed: bool
    feedback: str
    status: str

    def summary(self):
        return {"status": self.status, "passed": self.passed, "program": self.program, "stderr": self.feedback}


class FixCodeEnv:
    """Each action's last ```python block runs against the tests in the sandbox; the
    failure is the observation; done when they pass."""

    def reset(self, task):
        self.task = task
        return ""

    def step(self, action):
        code = extract_code(action)
        attempt = script_judge()(self.task, code)
        run = AttemptRun(code, attempt.passed, attempt.feedback, attempt.status)
        return StepResult(attempt.feedback, attempt.passed, {"process": float(attempt.passed)}, run)

    def close(self):
        pass


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
        return FixCodeEnv


def coding_policy(context: str, j: int) -> str:
    """Reads the last error: an expected value gives the factor, a NameError the fix."""
    expected = re.findall(r"f\((\d+)\) returned .*?, expected (\d+)", context)
    if expected:
        x, want = map(int, expected[-1])
        return f"```python\ndef f(x):\n    return x * {want // x}\n```"
    if "NameError" in context or j % 2 == 0:
        return "```python\ndef f(x):\n    return x * 1\n```"
    return "```python\ndef f(x):\n    return x * factor\n```"


def _run(domain, policy, tasks, n=4, execute=None, engine=None):
    cfg = PipelineConfig(execute_workers=2, backoff_s=0.0)
    sched = Scheduler(cfg, {domain.name: 1.0}, {domain.name: "short"})
    workers = (
        EmbeddedWorkers(engine or ScriptedEngine(policy), execute)
        if execute
        else EmbeddedWorkers(engine or ScriptedEngine(policy))
    )

    async def go():
        async with Pipeline(cfg, workers, SamplingParams(n=n, max_tokens=200), sched, seed=1) as p:
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
    assert any("NameError" in t.observation for r in rollouts for t in r.turns)
    assert all(r.reward == 1.0 for r in rollouts)
    # every turn keeps its own sandbox result and parts; the episode's exec_result is the last turn's
    assert all(t.exec_result is not None and "process" in t.parts for r in rollouts for t in r.turns)
    assert all(r.exec_result is r.turns[-1].exec_result for r in rollouts)
    assert stats.counters["finished"] == 4


def _attempt_passed(rollout, turn: int) -> bool:
    turns = rollout.turns  # every sandboxed attempt, in order; an episode that passed stopped there
    return turns[min(turn, len(turns) - 1)].exec_result.passed


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


def test_trace_explain_shows_each_turn_program_result_and_verdict(fixcode, tmp_path):
    from posttrain.domains.registry import verifier_label
    from posttrain.trace import TraceStore
    from posttrain.trace.explain import explain
    from posttrain.trace.rows import rollout_record

    [group], _ = _run(fixcode, coding_policy, [fixcode.sample(2, "train", 1)], n=2)
    store = TraceStore(tmp_path / "trace.db")
    ids = store.write_rollouts(
        [rollout_record(r, SamplingParams(max_tokens=200), verifier_label) for r in group.rollouts]
    )
    row = store.get(ids[1])
    assert [t["action"] for t in row["turns"]] == [t.action for t in group.rollouts[1].turns]
    out = explain(store, ids[1])
    assert "-- turn 1/3: action" in out and "-- turn 3/3: action" in out
    assert "-- turn 1: program that ran" in out and "return x * factor" in out
    assert "-- turn 1: execution result" in out and "NameError" in out
    assert "turn 3 reward parts: process=1.0000" in out and "turn 1 reward parts: process=0.0000" in out
    assert "-- verifier final_attempt@1" in out and "reward 1.0000  passed yes" in out


class Lookup:
    """The value is only reachable through the world: reset shows the keys, `get KEY`
    returns a value, `answer V` ends the episode; anything else is a protocol error
    (an observation, counted)."""

    made: list = []
    flaky_at = 0

    def __init__(self):
        self.steps = 0
        Lookup.made.append(self)
        self.flaky = len(Lookup.made) == Lookup.flaky_at

    def reset(self, task):
        self.errors = 0
        return "keys: a, b"

    def step(self, action):
        if self.flaky:
            self.flaky = False
            raise SandboxError("environment worker died")
        self.steps += 1
        verb, _, arg = action.partition(" ")
        if verb == "get" and arg in ("a", "b"):
            return StepResult({"a": "42", "b": "7"}[arg], False, {"protocol": 1.0})
        if verb == "answer":
            return StepResult("recorded", True, {"protocol": 1.0}, {"answer": arg})
        self.errors += 1
        return StepResult(f"protocol error: unknown action {action!r}", False, {"protocol": 0.0})

    def close(self):
        pass


class LookupVerifier:
    name, version = "lookup_answer", "1"

    def score(self, task, episode):
        ok = episode.completion == f"answer {task.reference}"
        protocol = sum(t.parts.get("protocol", 0.0) for t in episode.turns) / max(1, len(episode.turns))
        return Score(0.5 * float(ok) + 0.5 * protocol, {"outcome": float(ok), "protocol": protocol}, ok)


class LookupWorld(Domain):
    name, category, budget = "test_lookup", "test", Budget(turns=4, tokens=200)
    verifier = LookupVerifier()

    def sample(self, index, split, difficulty):
        return Task(
            f"lookup:{index}",
            self.name,
            (Message("user", "What is stored under key a?"),),
            "42",
            TaskMeta(split, 1, "test", "1"),
        )

    def gold(self, task):
        return "answer 42"

    def wrong(self, task):
        return "answer 7"

    def environment(self):
        return Lookup


def lookup_policy(context: str, j: int) -> str:
    """Needs the first observation to act; samples 0-2 break the protocol once."""
    if "keys: a, b" not in context:
        return "answer ?"
    if "<|tool|>42" in context:
        return "answer 42"
    if "protocol error" in context:
        return "get a"
    return ["look a", "search a", "get", "get a"][j % 4]


@pytest.fixture
def lookup(monkeypatch):
    dom = LookupWorld()
    monkeypatch.setitem(registry._REGISTRY, dom.name, dom)
    Lookup.made, Lookup.flaky_at = [], 0
    return dom


def test_first_observation_is_in_the_prompt_and_parts_reach_the_verifier(lookup):
    [group], _ = _run(lookup, lookup_policy, [lookup.sample(0, "train", 1)], n=4)
    parts = [r.score.parts for r in group.rollouts]
    assert all(p["outcome"] == 1.0 for p in parts)
    assert [p["protocol"] for p in parts] == [pytest.approx(2 / 3)] * 3 + [1.0]
    assert all(r.first_observation == "keys: a, b" and r.prompt_text.endswith("\nkeys: a, b") for r in group.rollouts)
    assert [r.timings["turns"] for r in group.rollouts] == [3.0, 3.0, 3.0, 2.0]
    assert all(r.exec_result == {"answer": "42"} for r in group.rollouts)  # the last turn's exec_result


def test_a_truncated_action_ends_the_episode(lookup):
    class Truncating(ScriptedEngine):
        def generate(self, requests):
            out = super().generate(requests)
            return [[dataclasses.replace(c, finish_reason="length") for c in g] for g in out]

    [group], _ = _run(lookup, lookup_policy, [lookup.sample(0, "train", 1)], n=2, engine=Truncating(lookup_policy))
    assert all(r.timings["turns"] == 1.0 and r.completion.finish_reason == "length" for r in group.rollouts)


def test_environment_infra_error_retries_only_unstepped_trajectories(lookup):
    Lookup.flaky_at = 2
    [group], stats = _run(lookup, lookup_policy, [lookup.sample(0, "train", 1)], n=4)
    assert stats.counters["retries"] == 1 and stats.counters["masked_groups"] == 0
    assert [r.timings["turns"] for r in group.rollouts] == [3.0, 3.0, 3.0, 2.0]
    # one environment per sample, made at admission, and no action was stepped twice
    assert [e.steps for e in Lookup.made] == [3, 3, 3, 2]


def test_environment_that_cannot_start_masks_its_group(lookup, monkeypatch):
    class Broken:
        def reset(self, task):
            raise OSError("tool server unreachable")

        def step(self, action):
            raise AssertionError("never stepped")

        def close(self):
            pass

    monkeypatch.setattr(lookup, "environment", lambda: Broken)
    [group], stats = _run(lookup, lookup_policy, [lookup.sample(0, "train", 1)], n=2)
    assert stats.counters["masked_groups"] == 1
    assert all(r.reward is None and "tool server unreachable" in r.error for r in group.rollouts)


class LastActionExecute:
    """The execute stage of a multi-turn domain that executes: it runs each episode's
    last action once the episode is over (the first `fail` calls die as a sandbox)."""

    def __init__(self, fail=0):
        self.fail, self.seen = fail, []

    def __call__(self, task, completion):
        if self.fail:
            self.fail -= 1
            raise SandboxError("sandbox worker died")
        self.seen.append(completion.text)
        return {"ran": completion.text}


def test_execute_stage_runs_the_last_action_after_the_episode(lookup, monkeypatch):
    monkeypatch.setattr(type(lookup), "executes", property(lambda self: True))
    ex = LastActionExecute(fail=1)
    [group], stats = _run(lookup, lookup_policy, [lookup.sample(0, "train", 1)], n=4, execute=ex)
    # only ever the last action, after the episode ended; the stage retried the one failed run (3 + 1 calls)
    assert ex.seen == ["answer 42"] * 4
    assert stats.counters["retries"] == 1
    assert all(r.exec_result == {"ran": "answer 42"} and r.reward is not None for r in group.rollouts)


def test_execute_stage_fault_that_persists_is_masked_and_counted(lookup, monkeypatch):
    monkeypatch.setattr(type(lookup), "executes", property(lambda self: True))
    [group], stats = _run(
        lookup, lookup_policy, [lookup.sample(0, "train", 1)], n=2, execute=LastActionExecute(fail=100)
    )
    assert stats.counters["masked_execute"] == 2
    assert all(r.reward is None and r.error_kind == "sandbox" for r in group.rollouts)


def test_a_version_1_trace_gains_the_turns_column(tmp_path):
    import sqlite3

    from posttrain.trace import _SCHEMA, SCHEMA_VERSION, TraceStore

    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript(_SCHEMA.replace("    turns TEXT,\n", ""))
    db.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    db.commit()
    db.close()
    store = TraceStore(path)
    cols = [r["name"] for r in store._db.execute("PRAGMA table_info(rollouts)")]
    version = store._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
    assert "turns" in cols and int(version) == SCHEMA_VERSION == 4


def test_a_version_2_trace_gains_the_retries_column(tmp_path):
    import sqlite3

    from posttrain.trace import _COLUMNS, _SCHEMA, RolloutRecord, TraceStore, _row

    path = tmp_path / "v2.db"
    db = sqlite3.connect(path)
    db.executescript(_SCHEMA.replace("    retries INTEGER NOT NULL DEFAULT 0,\n", ""))
    db.execute("INSERT INTO meta VALUES ('schema_version', '2')")
    rec = RolloutRecord("t", "add", "train", 1, "v", "0:0", 0, {}, "p", "c", 1, "stop", 1.0, True, {}, "", "x", {})
    row = {c: v for c, v in zip(_COLUMNS, _row(rec)) if c != "retries"}
    db.execute(f"INSERT INTO rollouts ({','.join(row)}) VALUES ({','.join('?' * len(row))})", list(row.values()))
    db.commit()
    db.close()
    store = TraceStore(path)
    assert store.get(rec.id)["retries"] == 0  # the rows written before the column count no retries


def test_environment_without_close_is_a_clear_error_never_a_score(lookup, monkeypatch):
    class NoClose:
        def reset(self, task):
            return ""

        def step(self, action):
            return "ok", True

    monkeypatch.setattr(lookup, "environment", lambda: NoClose)
    [group], stats = _run(lookup, lookup_policy, [lookup.sample(0, "train", 1)], n=2)
    assert stats.counters["masked_groups"] == 1
    assert all(r.reward is None and "has no close" in r.error for r in group.rollouts)


class SlowFirstEnv(FixCodeEnv):
    """FixCodeEnv whose steps on task fix:0 take `delay` seconds longer (its turns come back last)."""

    delay = 0.0

    def step(self, action):
        if self.task.id == "fix:0":
            time.sleep(SlowFirstEnv.delay)
        return super().step(action)


class CallLog(ScriptedEngine):
    """ScriptedEngine that keeps each call's groups (the task numbers its requests' prompts name)."""

    def __init__(self, policy, delay_s):
        super().__init__(policy, delay_s=delay_s)
        self.groups: list[list[int]] = []

    def generate(self, requests):
        tasks = {int(re.search(r"index (\d+)", self.decode(r.prompt_ids)).group(1)) for r in requests}
        self.groups.append(sorted(tasks))  # a later turn asks once per episode
        return super().generate(requests)


def _gathered(monkeypatch, fixcode, delay: float, **cfg):
    """Four coding-loop groups of two (three turns each: every first attempt fails, half the second),
    task 0's environment `delay` seconds slower; the engine's calls and the pipeline's counters."""
    SlowFirstEnv.delay = delay
    monkeypatch.setattr(FixCode, "environment", lambda self: SlowFirstEnv)
    engine = CallLog(coding_policy, delay_s=0.2)
    config = PipelineConfig(execute_workers=2, backoff_s=0.0, **cfg)
    sched = Scheduler(config, {fixcode.name: 1.0}, {fixcode.name: "short"})

    async def go():
        async with Pipeline(config, EmbeddedWorkers(engine), SamplingParams(n=2, max_tokens=200), sched, seed=1) as p:
            return await p.run_groups([fixcode.sample(i, "train", 1) for i in range(4)]), p.stats()

    results, stats = asyncio.run(go())
    assert all(r.error is None and r.reward == 1.0 for g in results for r in g.rollouts)
    return engine.groups, stats.counters


def test_a_call_gathers_every_group_due_a_turn(monkeypatch, fixcode):
    # the turn of the slow group is waited for: each turn of all four groups is one engine call
    calls, counters = _gathered(monkeypatch, fixcode, 0.5, gather_share=100.0, gather_max_s=30.0)
    assert calls == [[0, 1, 2, 3]] * 3  # the slow group was waited for
    assert counters["gathered"] >= 1 and counters["gather_ms"] > 0


def test_without_gathering_a_call_starts_on_what_is_queued(monkeypatch, fixcode):
    calls, counters = _gathered(monkeypatch, fixcode, 0.5, gather_share=0.0)
    assert len(calls) > 3 and [0] in calls  # the slow group's later turns went alone
    assert counters["gathered"] == 0 and counters["gather_ms"] == 0


def test_a_gathering_call_waits_at_most_gather_max_s(monkeypatch, fixcode):
    # the same share as the test above, the limit under the slow group's 0.5 s: its later turns go
    # alone, the others' calls were not held for it (judged by the calls, not by a clock: the
    # milliseconds waited depend on the machine's load; a timed bound here failed under load)
    calls, counters = _gathered(monkeypatch, fixcode, 0.5, gather_share=100.0, gather_max_s=0.05)
    assert len(calls) > 3 and [0] in calls
