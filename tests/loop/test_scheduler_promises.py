"""The scheduler's promises, observed in `posttrain.loop.train` (issue 26, item 5): per-domain
quotas of in-flight groups and admission priorities, on the direct path and the staged pipeline.

The seam is the engine: every training generation call is recorded with the group ids of its
requests (a group id is `step:index`; the trace maps it to its domain). A domain's groups in one
engine call are in flight together, so a call holding more than a domain's quota breaks it; the
order of the calls under an in-flight cap of one group is the admission order. Each promise is
checked against a control run without it, so the test shows the loop does something."""

from __future__ import annotations

import os
import re

import pytest
from loopcfg import tiny

from posttrain.configs import load_config
from posttrain.trace import TraceStore

LIGHT = ["eval.tasks_per_domain=2", "eval.samples=0", "monitor.report=false"]
"""The least evaluation a run does: these tests observe its training step."""
GROUP = re.compile(r"^\d+:\d+$")  # a training group's request id (evaluation requests carry task ids)


@pytest.fixture
def engine_calls(monkeypatch):
    """The request ids of every training generation call, in call order."""
    from posttrain.engine.hf import HFEngine

    calls: list[list[str]] = []
    real = HFEngine.generate

    def generate(self, requests):
        ids = [r.request_id for r in requests if GROUP.match(r.request_id)]
        if ids:
            calls.append(ids)
        return real(self, requests)

    monkeypatch.setattr(HFEngine, "generate", generate)
    return calls


def _run(tmp_path, base, name, *extra):
    from posttrain.loop import train

    overrides = [*tiny(), "rollout.prompts_per_step=6", "run.steps=1", *LIGHT]
    cfg = load_config(None, [*overrides, f"model.path={base}", f"run.out_dir={tmp_path}", f"run.name={name}", *extra])
    result = train(cfg, log=lambda *_: None)
    rows = TraceStore(result.run_dir / "trace.db").recent(1000)
    return {r["group_id"]: r["domain"] for r in rows}


def _most_in_one_call(calls, domains):
    """The most groups of one domain that one engine call held."""
    return max(max([domains[g] for g in call].count(d) for d in set(domains.values())) for call in calls)


@pytest.mark.parametrize("direct", ["true", "false"])
def test_domain_quota_bounds_groups_in_flight(tmp_path, micro_base, engine_calls, direct):
    free = _run(tmp_path, micro_base, f"free{direct}", f"pipeline.direct={direct}")
    unbounded = _most_in_one_call(engine_calls, free)
    assert unbounded > 1, "the control run never had two groups of a domain in flight: the test would be vacuous"
    engine_calls.clear()
    bound = _run(tmp_path, micro_base, f"quota{direct}", f"pipeline.direct={direct}", "pipeline.domain_quota=1")
    assert _most_in_one_call(engine_calls, bound) == 1
    assert len(bound) == len(free) == 6, "every group still ran"


def test_per_domain_quota_overrides_the_pipeline_one(tmp_path, micro_base, engine_calls):
    domains = "{add: {difficulty: 1, max_inflight: 1}, reverse: {difficulty: 1}}"
    groups = _run(tmp_path, micro_base, "perdomain", f"tasks.domains={domains}", "pipeline.domain_quota=2")
    per = [[groups[g] for g in call] for call in engine_calls]
    assert max(c.count("add") for c in per) == 1
    assert max(c.count("reverse") for c in per) == 2


def _order(calls, domains):
    """Per step, the domains of its groups in the order they were generated."""
    out: dict[str, list[str]] = {}
    for call in calls:
        for g in call:
            out.setdefault(g.split(":")[0], []).append(domains[g])
    return out


@pytest.mark.parametrize("direct", ["true", "false"])
def test_priority_decides_admission_order(tmp_path, micro_base, engine_calls, direct):
    cap = ["pipeline.max_inflight=1", "pipeline.min_inflight=1", "pipeline.long_slots=0", f"pipeline.direct={direct}"]
    plain = _order(engine_calls, _run(tmp_path, micro_base, f"plain{direct}", *cap))
    assert any(o != sorted(o, key=lambda d: d != "reverse") for o in plain.values()), (
        "without priorities reverse already came first: the test would be vacuous"
    )
    engine_calls.clear()
    domains = "{add: {difficulty: 1}, reverse: {difficulty: 1, priority: 5}}"
    ranked = _order(engine_calls, _run(tmp_path, micro_base, f"prio{direct}", *cap, f"tasks.domains={domains}"))
    assert all(len(c) == 1 for c in engine_calls), "the cap of one group in flight was not kept"
    for step, order in ranked.items():
        assert "reverse" in order and "add" in order, step
        assert order == sorted(order, key=lambda d: d != "reverse"), (step, order)


@pytest.fixture
def flaky_domain(monkeypatch):
    """A domain whose verifier raises VerifierError (transient, infra) the first time it sees a
    (task, completion), then scores it. `make(cheap)`: cheap verifiers take the direct path."""
    import threading

    from posttrain.domains import registry
    from posttrain.domains.base import ProceduralDomain
    from posttrain.errors import VerifierError
    from posttrain.types import Score

    failed: set[tuple[str, str]] = set()
    lock = threading.Lock()

    class Flaky:
        name, version = "flaky", "1"

        def __init__(self, cheap):
            self.cheap = cheap

        def score(self, task, episode):
            with lock:
                key = (task.id, episode.completion)
                first = key not in failed
                failed.add(key)
            if first:
                raise VerifierError("judge service unavailable (transient)")
            return Score(float(len(episode.completion) % 2))

    def make(cheap: bool) -> str:
        cls = type(
            "flaky",
            (ProceduralDomain,),
            {
                "name": "flaky",
                "category": "test",
                "generate": lambda self, rng, difficulty: (f"{rng.randint(0, 999)}+{rng.randint(0, 999)}=", "0"),
            },
        )
        dom = cls()
        dom.verifier = Flaky(cheap)
        monkeypatch.setitem(registry._REGISTRY, "flaky", dom)
        return "tasks.domains={flaky: {difficulty: 1}}"

    make.failed = failed
    return make


@pytest.mark.parametrize("cheap", [True, False], ids=["direct", "staged"])
def test_transient_verifier_failure_is_retried_and_recorded(tmp_path, micro_base, flaky_domain, cheap):
    from posttrain.loop import train

    domain = flaky_domain(cheap)
    overrides = [*tiny(), "run.steps=2", "pipeline.backoff_s=0", *LIGHT]
    cfg = load_config(None, [*overrides, domain, f"model.path={micro_base}", f"run.out_dir={tmp_path}", "run.name=r"])
    result = train(cfg, log=lambda *_: None)
    rows = [r for r in TraceStore(result.run_dir / "trace.db").recent(1000) if r["split"] == "train"]
    assert len(rows) == 2 * 4 * 4
    assert all(r["reward"] is not None and r["error_kind"] is None for r in rows), "a transient failure was masked"
    # each (task, completion) failed once, the first time: its first row went through one retry
    assert set(r["retries"] for r in rows) <= {0, 1}
    assert sum(r["retries"] for r in rows) >= len({(r["task_id"], r["completion"]) for r in rows}) > 0


@pytest.mark.skipif(os.geteuid() != 0, reason="the fork-server backend needs root")
def test_the_runs_sandbox_config_is_the_pools_from_the_first_use(tmp_path, micro_base, monkeypatch):
    """Every sandbox pool the run starts (cheat probes, the evaluation before training, the execute
    stage) has the run's `sandbox` config, and none is closed while the run lasts."""
    from posttrain import sandbox
    from posttrain.configs.sandbox import SandboxConfig
    from posttrain.loop import train
    from posttrain.pipeline import workers
    from posttrain.sandbox.pool import Pool

    sandbox.close_pool()  # a pool another test left: the run starts from none
    monkeypatch.setattr(workers, "_POOL_CONFIG", [None])
    started: list[SandboxConfig] = []
    closed: list[SandboxConfig] = []
    init, close = Pool.__init__, Pool.close
    monkeypatch.setattr(
        Pool, "__init__", lambda self, config=None, **kw: (started.append(config), init(self, config, **kw))[1]
    )
    monkeypatch.setattr(Pool, "close", lambda self: (closed.append(self.config), close(self))[1])
    overrides = [*tiny("{code: {difficulty: 1}}"), "rollout.prompts_per_step=2", "rollout.group_size=2"]
    run = [*overrides, "run.steps=1", *LIGHT, "monitor.probes.tasks=2", "sandbox.workers=3"]
    cfg = load_config(None, [*run, f"model.path={micro_base}", f"run.out_dir={tmp_path}", "run.name=sb"])
    result = train(cfg, log=lambda *_: None)
    rows = TraceStore(result.run_dir / "trace.db").recent(100)
    assert rows and all(r["exec_result"] is not None for r in rows), "the execute stage never ran a program"
    assert started == [cfg.sandbox.pool_config()], "a pool started without the run's sandbox config, or twice"
    assert started[0].workers == 3
    assert closed == [], "a live pool was closed during the run"
