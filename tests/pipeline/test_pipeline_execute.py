"""The execute stage: a domain's declared execute step runs in the pipeline (real
sandbox), the verifier reads its result and makes no sandbox call, a sandbox fault is
retried and then masked and counted (never scored 0), the trace row carries the
execution result and `trace explain` shows it; per-domain token budgets."""

from __future__ import annotations

import asyncio
import json
import os
import re

import pytest
from pipeline_testlib import ScriptedEngine

from posttrain import sandbox
from posttrain.configs.pipeline import PipelineConfig
from posttrain.domains.base import Budget
from posttrain.domains.code import CodeRun
from posttrain.domains.geo3d import GeoRun
from posttrain.domains.registry import get
from posttrain.pipeline import EmbeddedWorkers, Pipeline, Scheduler
from posttrain.pipeline.budget import domain_budgets
from posttrain.pipeline.workers import DomainExecute
from posttrain.types import Completion, Episode, SamplingParams

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the fork-server sandbox backend needs root")
FAST = dict(backoff_s=0.001, execute_workers=2, verify_workers=2, degrade_after=1)


def gold_or_wrong(tasks):
    """Sample j of a task: its gold completion when j is even, its wrong one when odd."""
    table = [(t.prompt[0].content, get(t.domain).gold(t), get(t.domain).wrong(t)) for t in tasks]

    def policy(context: str, j: int) -> str:
        for prompt, gold, wrong in table:
            if prompt in context:
                return wrong if j % 2 else gold
        raise AssertionError("unknown prompt")

    return policy


class CountingSandbox:
    """The real process-wide sandbox, counting calls; the first `fail` calls (all when
    fail < 0) come back as infra_error, as from a worker that died."""

    def __init__(self, fail: int = 0) -> None:
        self.fail, self.calls = fail, 0
        self.real = sandbox.run

    def __call__(self, req, *, domain=None):
        self.calls += 1
        if self.fail < 0 or self.calls <= self.fail:
            return sandbox.ExecResult("infra_error", error="injected: worker died")
        return self.real(req, domain=domain)


def _run(tasks, n=2, cfg=None, engine=None, budgets=None, params=None):
    cfg = cfg or PipelineConfig(**FAST)
    domains = sorted({t.domain for t in tasks})
    events = []
    sched = Scheduler(
        cfg, {d: 1.0 for d in domains}, {d: "short" for d in domains}, lambda kind, msg, dom, data: events.append(kind)
    )
    engine = engine or ScriptedEngine(gold_or_wrong(tasks))
    params = params or SamplingParams(n=n, max_tokens=4096)

    async def go():
        async with Pipeline(cfg, EmbeddedWorkers(engine, DomainExecute()), params, sched, seed=1, budgets=budgets) as p:
            return await p.run_groups(tasks), p.stats()

    results, stats = asyncio.run(go())
    return [r for g in results for r in g.rollouts], stats, events


@needs_root
def test_code_runs_in_the_execute_stage_and_the_verifier_makes_no_sandbox_call(monkeypatch, tmp_path):
    counting = CountingSandbox()
    monkeypatch.setattr(sandbox, "run", counting)
    tasks = [get("code").sample(i, "train", 1) for i in range(2)]
    rollouts, stats, _ = _run(tasks)
    assert counting.calls == 4  # one run per completion, all in the execute stage; none in verify
    assert all(isinstance(r.exec_result, CodeRun) and r.timings["execute_s"] > 0 for r in rollouts)
    assert [r.reward == 1.0 for r in rollouts] == [True, False, True, False]  # gold, wrong, gold, wrong

    # the trace row carries the execution result; `trace explain` shows program, result and verdict
    from posttrain.domains.registry import verifier_label
    from posttrain.trace import TraceStore
    from posttrain.trace.explain import explain
    from posttrain.trace.rows import rollout_record

    store = TraceStore(tmp_path / "trace.db")
    ids = store.write_rollouts([rollout_record(r, SamplingParams(n=2), verifier_label) for r in rollouts])
    row = store.get(ids[1])
    assert row["exec_result"]["status"] in ("ok", "failed") and len(row["exec_result"]["tests"]) > 0
    assert "cpu_s" in row["exec_result"] and "def " in row["exec_result"]["program"]
    text = explain(store, ids[1])
    assert "-- program that ran" in text and "test 0: kind=" in text and "no program ran" not in text
    assert "-- verifier code_tests@2" in text and "passed no" in text
    store.close()


@needs_root
@pytest.mark.parametrize("domain", ["code", "geo_box"])
def test_sandbox_fault_in_execute_is_retried_then_scored(monkeypatch, domain):
    counting = CountingSandbox(fail=1)
    monkeypatch.setattr(sandbox, "run", counting)
    rollouts, stats, _ = _run([get(domain).sample(0, "train", 1)])
    assert stats.counters["retries"] >= 1 and stats.counters["masked_groups"] == 0
    assert all(r.reward is not None and r.exec_result is not None for r in rollouts)
    gold, wrong = rollouts
    assert gold.score.passed and len(gold.turns) <= 1  # code is single-turn; geo passes on its first turn
    if get(domain).environment() is None:
        assert not wrong.score.passed
    else:  # multi-turn geo: the wrong first script gets a failing constraint report, so the episode goes on
        assert "FAIL" in wrong.turns[0].observation and len(wrong.turns) > 1


@needs_root
@pytest.mark.parametrize("domain", ["code", "geo_box"])
def test_persistent_sandbox_fault_is_masked_counted_never_zero(monkeypatch, domain):
    monkeypatch.setattr(sandbox, "run", CountingSandbox(fail=-1))
    rollouts, stats, events = _run([get(domain).sample(0, "train", 1)], cfg=PipelineConfig(max_retries=2, **FAST))
    assert stats.counters["retries"] == 2 and stats.counters["masked_execute"] == 2
    assert all(
        r.reward is None and r.score is None and r.error_kind == "sandbox" and "injected" in r.error for r in rollouts
    )
    assert "alarm" in events  # the scheduler's degradation applies to a sandbox that keeps failing


@needs_root
def test_geo_execute_step_reports_the_mesh_and_score_reads_it(monkeypatch):
    task = get("geo_box").sample(0, "train", 1)
    ran = get("geo_box").execute(task, get("geo_box").gold(task))
    assert isinstance(ran, GeoRun) and ran.measures["watertight"] and ran.summary()["report"]["volume"] > 0
    json.dumps(ran.summary())  # plain JSON data for the trace
    monkeypatch.setattr(sandbox, "run", CountingSandbox(fail=-1))  # any sandbox call now would be an infra error
    assert get("geo_box").score(task, Episode(get("geo_box").gold(task), exec_result=ran)).passed


@needs_root
def test_byo_code_verifier_declares_the_execute_step(monkeypatch):
    from posttrain.byo.domain import RowRef
    from posttrain.byo.verifiers import build_verifier
    from posttrain.configs.byo import VerifierSpec
    from posttrain.types import Message, Task, TaskMeta

    tests = [{"args": [5, 0, 10], "expected": 5}, {"args": [12, 0, 10], "expected": 10}]
    task = Task("t:1", "t", (Message("user", "q"),), RowRef(json.dumps(tests), {}), TaskMeta("train", 1, "test", "v"))
    v = build_verifier(VerifierSpec.model_validate({"name": "code", "entry": "clamp"}))
    ran = v.execute(task, "```python\ndef clamp(x, lo, hi):\n    return max(lo, x)\n```")
    assert isinstance(ran, CodeRun) and ran.status == "ok"
    monkeypatch.setattr(sandbox, "run", CountingSandbox(fail=-1))
    s = v.score(task, Episode("(ignored: the execution result decides)", exec_result=ran))
    assert s.value == 0.5 and not s.passed


# ---------------------------------------------------------------- per-domain budgets


class BudgetEngine(ScriptedEngine):
    """Honours max_tokens (cuts the scripted text, finish reason `length`) and records
    the max_tokens of the requests of every call."""

    def __init__(self, policy):
        super().__init__(policy)
        self.call_budgets: list[set[int]] = []

    def generate(self, requests):
        self.call_budgets.append({r.params.max_tokens for r in requests})
        out = super().generate(requests)
        for req, group in zip(requests, out):
            for j, c in enumerate(group):
                cap = req.params.max_tokens
                if len(c.token_ids) > cap:
                    ids = c.token_ids[:cap]
                    group[j] = Completion(
                        c.prompt_ids, ids, self.decode(ids), c.logprobs[:cap], "length", c.model_version
                    )
        return out


def test_mixed_budgets_generate_in_separate_calls_each_capped_at_its_own():
    from posttrain.configs.tasks import TasksConfig
    from posttrain.tasks.pool import resolve_specs

    long_name = "math_arith_nth"
    cfg = TasksConfig.model_validate({"domains": {"add": {}, long_name: {"max_tokens": 40}}})
    specs = {n: s for n, (_, s) in resolve_specs(cfg).items()}
    budgets = domain_budgets(specs, specs)
    assert budgets["add"] == Budget(tokens=16) and budgets[long_name].tokens == 40  # declared, and overridden
    tasks = [get("add").sample(i, "train", 1) for i in range(3)] + [
        get(long_name).sample(i, "train", 1) for i in range(3)
    ]
    engine = BudgetEngine(lambda context, j: "7" * 100)
    rollouts, stats, _ = _run(tasks, engine=engine, budgets=budgets, params=SamplingParams(n=2, max_tokens=999))
    assert all(len(b) == 1 for b in engine.call_budgets)  # no call mixes budgets: short rows never pad to long ones
    lengths = {d: {len(r.completion.token_ids) for r in rollouts if r.task.domain == d} for d in ("add", long_name)}
    assert lengths == {"add": {16}, long_name: {40}}
    assert all(r.completion.finish_reason == "length" for r in rollouts)


def test_budget_cap_and_eval_use_the_same_budgets():
    from posttrain.evaluate.core import EvalOptions, eval_budgets, tokens_for
    from posttrain.pipeline.play import Play

    assert domain_budgets(["code", "add"], cap=512)["code"].tokens == 512  # rollout.max_tokens caps
    assert domain_budgets(["code", "add"], cap=512)["add"].tokens == 16
    opts = EvalOptions(budgets={"math_arith_nth": 40})
    assert (
        tokens_for("add", opts) == 16 and tokens_for("math_arith_nth", opts) == 40 and tokens_for("code", opts) == 1024
    )
    tasks = [
        get("math_arith_nth").sample(0, "eval", 1),
        get("add").sample(0, "eval", 1),
        get("add").sample(1, "eval", 1),
    ]
    engine = BudgetEngine(lambda context, j: "9" * 100)
    budgets = eval_budgets([t.domain for t in tasks], opts)
    out = Play(engine, SamplingParams(n=1), budgets, batch_size=8).groups(tasks)
    assert [len(g.played()[0].completion.token_ids) for g in out] == [40, 16, 16]  # task order kept
    assert engine.call_budgets == [{16}, {40}]  # 40 > 2 x 16: a call each, shortest first


@pytest.mark.parametrize("inline", [False, True], ids=["pipeline", "play"])
def test_budgets_within_twice_share_one_call_each_row_capped_at_its_own(inline):
    """arith_fmt (96 tokens) beside ifeval (160): one engine call, not two in series, in the
    staged pipeline and in the inline scheduler alike; each row still stops at its own budget."""
    from posttrain.pipeline.play import Play

    tasks = [get("add").sample(i, "train", 1) for i in range(2)] + [
        get("math_arith_nth").sample(i, "train", 1) for i in range(2)
    ]
    budgets = {"add": Budget(tokens=16), "math_arith_nth": Budget(tokens=24)}
    engine = BudgetEngine(lambda context, j: "7" * 100)
    if inline:
        out = Play(engine, SamplingParams(n=2), budgets, batch_size=8).groups(tasks)
        lengths = [{len(p.completion.token_ids) for p in g.played()} for g in out]
    else:
        rollouts, _, _ = _run(tasks, engine=engine, budgets=budgets, params=SamplingParams(n=2, max_tokens=999))
        by_task = {r.task.id: len(r.completion.token_ids) for r in rollouts}
        lengths = [{by_task[t.id]} for t in tasks]
    assert engine.call_budgets == [{16, 24}]
    assert lengths == [{16}, {16}, {24}, {24}]


def test_by_budget_merges_within_twice_the_shortest_and_keeps_order():
    from posttrain.pipeline.group import by_budget

    runs = [("a", 160), ("b", 96), ("c", 16), ("d", 1024), ("e", 32), ("f", 33), ("g", 96)]
    calls = by_budget(runs, lambda r: r[1])
    assert [[name for name, _ in c] for c in calls] == [["c", "e"], ["f"], ["b", "g", "a"], ["d"]]
    assert by_budget([], lambda r: r[1]) == []


@needs_root
def test_train_runs_code_beside_add_with_their_budgets_and_traces_exec_result(tmp_path, micro_base):
    from posttrain.configs import load_config
    from posttrain.loop import train
    from posttrain.metrics_log import read_metrics
    from posttrain.trace import TraceStore

    cfg = load_config(
        None,
        [
            "rollout.prompts_per_step=4",
            "rollout.group_size=2",
            "eval.tasks_per_domain=2",
            "eval.samples=0",
            "eval.contamination=false",
            "eval.exposure=false",
            "eval.above_tasks=0",
            "run.threads=1",
            "run.progress=false",
            "tasks.domains={add: {difficulty: 1}, code: {difficulty: 1, max_tokens: 24}}",
            "sandbox.workers=2",
            "sandbox.max_memory_mb=256",
            f"model.path={micro_base}",
            f"run.out_dir={tmp_path}",
            "run.name=mixed",
            "run.steps=2",
            "monitor.report=false",
        ],
    )
    result = train(cfg, log=lambda *_: None)
    store = TraceStore(result.run_dir / "trace.db")
    rows = store.recent(100)
    code = [r for r in rows if r["domain"] == "code"]
    add = [r for r in rows if r["domain"] == "add"]
    assert code and add
    assert all(r["completion_tokens"] <= 16 and r["sampling"]["max_tokens"] == 16 for r in add)
    assert all(r["completion_tokens"] <= 24 and r["sampling"]["max_tokens"] == 24 for r in code)
    assert all(r["exec_result"] is None for r in add)
    ran = [r for r in code if r["exec_result"] is not None]
    assert ran and all(r["exec_result"]["status"] in ("ok", "failed", "timeout", "oom", "killed") for r in ran)
    assert all(r["timings"]["execute_s"] > 0 for r in ran)
    train_rows = read_metrics(result.run_dir / "metrics.jsonl", "train")
    assert train_rows[-1]["token_budget_code"] == 24 and train_rows[-1]["token_budget_add"] == 16
    assert 0.0 <= train_rows[-1]["truncated_share_code"] <= 1.0
    store.close()


def test_sandbox_section_caps_each_domains_requests(monkeypatch):
    from posttrain.configs import load_config

    cfg = load_config(None, ["sandbox.workers=3", "sandbox.max_memory_mb=128", "sandbox.max_wall_s=20"])
    assert cfg.sandbox.pool_config().workers == 3 and not hasattr(cfg.sandbox.pool_config(), "max_wall_s")
    seen = []
    monkeypatch.setattr(
        sandbox, "run", lambda req, domain=None: seen.append((req.limits, domain)) or sandbox.ExecResult("ok")
    )
    execute = DomainExecute(None, cfg.sandbox.max_memory_mb, cfg.sandbox.max_wall_s, {"code": 3.0})
    task = get("code").sample(0, "train", 1)
    ran = execute(task, Completion((), (), get("code").gold(task), (), "stop", 0))
    ((limits, domain),) = seen
    assert domain == "code" and limits.memory_bytes == 128 << 20 and limits.wall_s == limits.cpu_s == 3.0
    assert isinstance(ran, CodeRun) and ran.status == "ok"
    assert execute(get("add").sample(0, "train", 1), Completion((), (), "1", (), "stop", 0)) is None  # no execute step


@needs_root
def test_trace_explain_on_a_code_revise_rollout_shows_each_turn(tmp_path):
    """The real coding loop: a wrong first program, the visible tests' failure as the
    observation, a revision; `trace explain` prints every turn's program, its execution
    result and the verifier's verdict."""
    from posttrain.domains.registry import verifier_label
    from posttrain.trace import TraceStore
    from posttrain.trace.explain import explain
    from posttrain.trace.rows import rollout_record

    rollouts, _, _ = _run([get("code_revise").sample(0, "train", 1)])
    wrong_first = rollouts[1]
    assert len(wrong_first.turns) >= 2 and all(t.exec_result is not None for t in wrong_first.turns)
    store = TraceStore(tmp_path / "trace.db")
    ids = store.write_rollouts([rollout_record(r, SamplingParams(n=2), verifier_label) for r in rollouts])
    out = explain(store, ids[1])
    n = len(wrong_first.turns)
    for k in range(1, n + 1):
        assert f"-- turn {k}/{n}: action" in out and f"-- turn {k}: program that ran" in out
        assert f"-- turn {k}: execution result" in out
    assert "-- verifier" in out and "reward" in out and "no program ran" not in out
    assert re.search(rf"\bturns={n}(,|\s|$)", out, re.M)  # the turn count as a count, not as milliseconds
    store.close()
