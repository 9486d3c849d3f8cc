"""Sandbox faults injected into a real pool, through the Pipeline: a fault during the
execute stage (the domain's execute step: code, code_revise's hidden tests, geo's
mesh check) or during an environment step (code_revise's visible tests, terminal's
commands) is retried; a transient one then scores as if nothing happened, a
persistent one masks the group and is counted (pipe_masked_*), never scored 0.

The faults sit at the runner seam: `DomainExecute.runner` for the execute stage,
the process-wide pool (`sandbox.get_pool`, which environment steps use) for the
steps. Each fault is what the pool gives when a worker dies (an infra_error
result) or when no worker is free (SandboxError)."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import os
import threading
from contextlib import contextmanager

import pytest
from pipeline_testlib import ScriptedEngine

from posttrain import sandbox
from posttrain.configs.pipeline import PipelineConfig
from posttrain.domains import terminal
from posttrain.domains.registry import get
from posttrain.errors import SandboxError
from posttrain.pipeline import EmbeddedWorkers, Pipeline, Scheduler
from posttrain.pipeline.workers import DomainExecute
from posttrain.types import SamplingParams

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the fork-server sandbox backend needs root")
needs_driver = pytest.mark.skipif(
    importlib.util.find_spec("posttrain.envs.driver") is None,
    reason="multi-turn StepResult environments run on the episode driver (issue 12)",
)
FAST = dict(backoff_s=0.001, execute_workers=2, verify_workers=2, degrade_after=1)
RETRIES = 2


class Faults:
    """A fault schedule shared by the seams: calls 1..`first` fail (every call
    when `first` < 0), as an infra_error result ("status") or a SandboxError ("raise")."""

    def __init__(self, first: int, mode: str = "status") -> None:
        self.first, self.mode, self.calls, self.injected = first, mode, 0, 0
        self._lock = threading.Lock()

    def fault(self) -> sandbox.ExecResult | None:
        with self._lock:
            self.calls += 1
            n = self.calls
            hit = self.first < 0 or n <= self.first
            self.injected += hit
        if not hit:
            return None
        if self.mode == "raise":
            raise SandboxError(f"injected: no worker free (call {n})")
        return sandbox.ExecResult("infra_error", error=f"injected: worker died (call {n})", backend="faulty")


class FaultyPool:
    """The real process-wide pool with `faults` at its run and session-run seams."""

    def __init__(self, real, faults: Faults) -> None:
        self.real, self.faults = real, faults

    def run(self, req, *, domain=None, timeout_s=None):
        return self.faults.fault() or self.real.run(req, domain=domain, timeout_s=timeout_s)

    @contextmanager
    def session(self, files=None, **kw):
        with self.real.session(files, **kw) as s:
            yield FaultySession(s, self.faults)


class FaultySession:
    def __init__(self, real, faults: Faults) -> None:
        self.real, self.faults = real, faults

    def run(self, req):
        return self.faults.fault() or self.real.run(req)

    def snapshot(self):
        return self.real.snapshot()

    def restore(self, snap):
        return self.real.restore(snap)


@dataclasses.dataclass(frozen=True)
class FaultyExecute(DomainExecute):
    """The pipeline's execute step with `faults` at its runner seam."""

    faults: Faults | None = None

    def runner(self, domain: str):
        real = super().runner(domain)

        def run(req):
            return self.faults.fault() or real(req)

        return run


def gold_policy(tasks):
    table = [(t.prompt[0].content, get(t.domain).gold(t)) for t in tasks]

    def policy(context: str, j: int) -> str:
        for prompt, gold in table:
            if prompt in context:
                return gold
        raise AssertionError("unknown prompt")

    return policy


def revising_policy(tasks):
    """Sample 0 answers gold; sample 1 answers wrong until it has seen a failure, then gold."""
    table = [(t.prompt[0].content, get(t.domain).gold(t), get(t.domain).wrong(t)) for t in tasks]

    def policy(context: str, j: int) -> str:
        for prompt, gold, wrong in table:
            if prompt in context:
                return gold if j == 0 or "FAILED" in context else wrong
        raise AssertionError("unknown prompt")

    return policy


def _run(task, execute: DomainExecute, n: int = 2, policy=None):
    cfg = PipelineConfig(max_retries=RETRIES, **FAST)
    sched = Scheduler(cfg, {task.domain: 1.0}, {task.domain: "short"}, lambda *a: None)
    engine = ScriptedEngine(policy or gold_policy([task]))

    async def go():
        async with Pipeline(
            cfg, EmbeddedWorkers(engine, execute), SamplingParams(n=n, max_tokens=4096), sched, seed=1
        ) as p:
            return await p.run_groups([task]), p.stats()

    (group,), stats = asyncio.run(go())
    return list(group.rollouts), stats.flat()


def _execute_stage(domain: str, faults: Faults):
    return _run(get(domain).sample(0, "train", 1), FaultyExecute(faults=faults))


def _step(domain: str, faults: Faults, monkeypatch):
    # the terminal step's first sandbox call is then the untouched task's checks, before any command of
    # the model: the sandbox's failure, which the pipeline retries (one after the commands ran is
    # replayed inside the step, tests/pipeline/test_blame_sandbox.py)
    terminal.untouched_checks.cache_clear()
    real = sandbox.get_pool()
    monkeypatch.setattr(sandbox, "get_pool", lambda: FaultyPool(real, faults))
    return _run(get(domain).sample(0, "train", 1), DomainExecute())


def _assert_retried_then_scored(rollouts, metrics, faults):
    assert faults.injected >= 1 and metrics["pipe_retries"] >= 1
    assert metrics["pipe_masked_groups"] == 0 and metrics["pipe_masked_rollouts"] == 0
    assert all(r.score is not None and r.score.value == 1.0 and r.error is None for r in rollouts)


def _assert_masked_never_zero(rollouts, metrics, faults):
    assert metrics["pipe_retries"] == RETRIES and faults.injected >= RETRIES + 1
    assert metrics["pipe_masked_groups"] == 1 and metrics["pipe_masked_rollouts"] == len(rollouts) == 2
    assert all(
        r.score is None and r.reward is None and r.error_kind == "sandbox" and "injected" in r.error for r in rollouts
    )


@needs_driver
def test_without_faults_the_loops_run_to_their_end_and_score():
    """The baseline of the faults below: code_revise revises after a failure (the
    hidden tests score the last answer), terminal's gold ends on `done` in one turn."""
    task = get("code_revise").sample(0, "train", 1)  # clamp: its wrong solution fails a visible test
    rollouts, metrics = _run(task, DomainExecute(), policy=revising_policy([task]))
    assert [r.timings["turns"] for r in rollouts] == [1.0, 2.0] and metrics["pipe_retries"] == 0
    assert [r.score.value for r in rollouts] == [1.0, 1.0]
    assert rollouts[1].score.parts == {"outcome": 1.0, "process": 0.75, "efficiency": 0.5, "moved": 1.0}
    assert all(r.exec_result.suite == "hidden" for r in rollouts)
    rollouts, _ = _run(get("terminal").sample(0, "train", 1), DomainExecute())
    assert [r.timings["turns"] for r in rollouts] == [1.0, 1.0] and all(r.score.value == 1.0 for r in rollouts)


@pytest.mark.parametrize("mode", ["status", "raise"])
@pytest.mark.parametrize("domain", ["code", "geo_box"])
def test_transient_fault_in_the_execute_stage_is_retried(domain, mode):
    faults = Faults(1, mode)
    _assert_retried_then_scored(*_execute_stage(domain, faults), faults)


@pytest.mark.parametrize("domain", ["code", "geo_box"])
def test_persistent_fault_in_the_execute_stage_is_masked_and_counted(domain):
    faults = Faults(-1)
    rollouts, metrics = _execute_stage(domain, faults)
    _assert_masked_never_zero(rollouts, metrics, faults)
    assert metrics["pipe_masked_execute"] == 2


@needs_driver
@pytest.mark.parametrize("mode", ["status", "raise"])
def test_transient_fault_in_code_revise_hidden_tests_is_retried(mode):
    faults = Faults(1, mode)
    _assert_retried_then_scored(*_execute_stage("code_revise", faults), faults)


@needs_driver
def test_persistent_fault_in_code_revise_hidden_tests_is_masked_and_counted():
    faults = Faults(-1)
    _assert_masked_never_zero(*_execute_stage("code_revise", faults), faults)


@needs_driver
@pytest.mark.parametrize("mode", ["status", "raise"])
@pytest.mark.parametrize("domain", ["code_revise", "terminal"])
def test_transient_fault_in_an_environment_step_is_retried(domain, mode, monkeypatch):
    faults = Faults(1, mode)
    _assert_retried_then_scored(*_step(domain, faults, monkeypatch), faults)


@needs_driver
@pytest.mark.parametrize("domain", ["code_revise", "terminal"])
def test_persistent_fault_in_an_environment_step_is_masked_and_counted(domain, monkeypatch):
    faults = Faults(-1)
    _assert_masked_never_zero(*_step(domain, faults, monkeypatch), faults)
