"""Blame by cause, as a property: no hostile output is masked, none crashes the host.

Every multi-turn domain (every registered domain with an environment) plays a group of
hostile episodes through the training Pipeline (real environments, real sandboxes, real
verifiers; only the engine is scripted, `hostile.PlanEngine`), and every registered
domain's verifier and every named verifier of `byo` scores hostile completions at the
verify boundary (`pipeline.workers.verify_one`, after the execute step where the domain
has one). Each sample must come back scored (a model fault is a score of 0 with its
reason), never masked, and no exception may escape. The default run takes a seeded
sample of the corpus per domain; `-m slow` runs the whole corpus everywhere. The planted
tests show the property fails under the old rule (blame by where it escaped).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import zlib

import pytest
from hostile import PlanEngine, corpus, generic, pick

from posttrain.configs.byo import VerifierSpec
from posttrain.configs.pipeline import PipelineConfig
from posttrain.domains.registry import all_domains
from posttrain.errors import ErrorRecord, capture
from posttrain.pipeline import EmbeddedWorkers, Pipeline, Scheduler
from posttrain.pipeline.workers import DomainExecute, Verdict, execute_one, verdict_of, verify_one
from posttrain.types import Completion, Episode, SamplingParams, Task

DOMAINS = all_domains()
MULTI = sorted(n for n, d in DOMAINS.items() if d.environment() is not None)
PER_GROUP = 4
"""Hostile samples per multi-turn group in the default run (the slow run plays the whole corpus)."""
PER_VERIFIER = 3


def _seed(name: str) -> int:
    return zlib.crc32(name.encode())


def _plans(name: str, task: Task, k: int | None) -> list[list[str]]:
    """Each sample's actions: a hostile action at once, or (every other sample, where the gold
    episode has more turns) the gold's first action and then the hostile one, deeper in the world."""
    gold = DOMAINS[name].gold_turns(task)
    hostile = corpus(gold, _seed(name))
    chosen = hostile if k is None else pick(hostile, k, _seed(name))
    return [[h] if i % 2 == 0 or len(gold) < 2 else [gold[0], h] for i, h in enumerate(chosen)]


def play_group(name: str, plans: list[list[str]], task: Task):
    """One group of `plans` through the Pipeline, as in training (turns: the longest plan, plus one)."""
    dom = DOMAINS[name]
    cfg = PipelineConfig(execute_workers=4, backoff_s=0.0)
    sched = Scheduler(cfg, {name: 1.0}, {name: dom.cost_class})
    budgets = {name: dataclasses.replace(dom.budget, turns=max(map(len, plans)) + 1)}
    params = SamplingParams(n=len(plans), max_tokens=dom.budget.tokens)

    async def go():
        async with Pipeline(cfg, EmbeddedWorkers(PlanEngine(plans)), params, sched, seed=0, budgets=budgets) as pipe:
            [group] = await pipe.run_groups([task])
            return group, pipe.stats()

    return asyncio.run(go())


def masked(rollouts, plans) -> list[str]:
    """The violations: samples that came back without a score."""
    return [
        f"{r.error_kind}: {r.error} <- {[p[:40] for p in plan]!r}"
        for r, plan in zip(rollouts, plans)
        if r.reward is None
    ]


def _check_multi(name: str, k: int | None) -> None:
    task = DOMAINS[name].sample(0, "train", 1)
    plans = _plans(name, task, k)
    group, stats = play_group(name, plans, task)  # an exception escaping the boundary fails here
    assert len(group.rollouts) == len(plans)
    assert not masked(group.rollouts, plans), (name, masked(group.rollouts, plans))
    assert stats.counters["masked_rollouts"] == 0


@pytest.mark.parametrize("name", MULTI)
def test_no_hostile_episode_is_masked_or_crashes_the_host(name):
    _check_multi(name, PER_GROUP)


@pytest.mark.slow
@pytest.mark.parametrize("name", MULTI)
def test_no_hostile_episode_of_the_whole_corpus_is_masked(name):
    _check_multi(name, None)


# ---- verifiers ------------------------------------------------------------------


def judge(task: Task, completion: str) -> Verdict:
    """The verdict of `completion` at the boundary: the execute step (where the domain has
    one, single-turn: a failed run is blamed by its cause), then the verifier."""
    dom = DOMAINS[task.domain]
    exec_result = None
    if dom.executes and dom.environment() is None:
        exec_result = execute_one(DomainExecute(), task, Completion((1,), (), completion, (), "stop", 0))
        if isinstance(exec_result, ErrorRecord):
            return verdict_of(exec_result)
    return verify_one(task, Episode(completion, exec_result=exec_result))


def unscored(task: Task, completions: list[str]) -> list[str]:
    """The violations among `completions`' verdicts: any without a score."""
    verdicts = [(c, judge(task, c)) for c in completions]
    return [f"{task.domain}: {v.error_kind}: {v.error} <- {c[:40]!r}" for c, v in verdicts if v.score is None]


def _check_domains(k: int | None) -> None:
    bad = []
    for name in sorted(DOMAINS):
        dom = DOMAINS[name]
        task = dom.sample(0, "train", 1)
        hostile = corpus([dom.gold(task)], _seed(name))
        bad += unscored(task, hostile if k is None else pick(hostile, k, _seed(name)))
    assert not bad, bad


def test_every_domains_verifier_scores_hostile_completions():
    _check_domains(PER_VERIFIER)


@pytest.mark.slow
def test_every_domains_verifier_scores_the_whole_corpus():
    _check_domains(None)


NAMED = {
    "exact": ({}, "42"),
    "numeric": ({}, "42"),
    "choice": ({}, "B"),
    "regex": ({"pattern": r"^\d+$"}, "42"),
    "math": ({}, "\\frac{1}{2}"),
    "json": ({}, {"a": 1, "b": "x"}),
    "sql": ({"database": "{db}"}, "SELECT x FROM t"),
    "code": ({"entry": "f"}, [{"args": [1], "expected": 2}]),
    "composite": ({"parts": [{"verifier": {"name": "exact"}}, {"verifier": {"name": "numeric"}, "weight": 2.0}]}, "42"),
    "python": ({"path": "byo_rewards:strict_int"}, "42"),
}
"""Every named verifier of byo that runs here, with parameters and a row's answer. The ones that
call a model (reward_model, judge, judge_ensemble) raise VerifierError when the service fails:
infra by design (tests/byo/test_byo_judge_bias.py runs them against served judges)."""


def test_every_named_verifier_is_listed():
    from posttrain.byo.verifiers import BUILTIN

    assert set(BUILTIN) - set(NAMED) == {"reward_model", "judge", "judge_ensemble"}


@pytest.fixture
def source_domain(monkeypatch, tmp_path):
    from posttrain.byo.domain import SourceDomain
    from posttrain.configs.byo import SourceConfig

    made = []

    db = tmp_path / "t.db"
    with sqlite3.connect(db) as conn:
        conn.executescript("CREATE TABLE t(x INTEGER); INSERT INTO t VALUES (1), (2);")

    def make(verifier: str, params: dict, answer) -> Task:
        params = {k: str(db) if v == "{db}" else v for k, v in params.items()}
        rows = tmp_path / f"{verifier}.jsonl"
        rows.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": answer}) + "\n" for i in range(4)))
        spec = VerifierSpec.model_validate({"name": verifier, **params})
        dom = SourceDomain(f"test_named_{verifier}", SourceConfig.model_validate({"path": str(rows)}), spec)
        made.append(dom)
        DOMAINS[dom.name] = dom
        monkeypatch.setattr("posttrain.domains.registry.get", lambda name: DOMAINS[name])
        return dom.task_at(0, "train", 1)

    yield make
    for dom in made:
        DOMAINS.pop(dom.name, None)
        if hasattr(dom.verifier, "close"):
            dom.verifier.close()


@pytest.mark.parametrize("verifier", sorted(NAMED))
def test_every_named_verifier_scores_hostile_completions(verifier, source_domain, monkeypatch):
    import os

    monkeypatch.chdir(os.path.join(os.path.dirname(__file__), "..", "byo", "userfns"))
    params, answer = NAMED[verifier]
    task = source_domain(verifier, params, answer)
    gold = DOMAINS[task.domain].gold(task)
    assert not unscored(task, pick(corpus([gold], _seed(verifier)), 12, _seed(verifier)))


# ---- the property can fail: the old rule, planted ---------------------------------


class Strict:
    """A verifier that trusts its input: it parses the completion as JSON and reads a field."""

    name, version, cheap = "strict", "1", True

    def score(self, task, episode):
        from posttrain.types import Score

        value = json.loads(episode.completion)["answer"]
        return Score(float(value == 1), passed=value == 1)


@pytest.fixture
def strict_domain(monkeypatch):
    from posttrain.domains.base import ProceduralDomain

    class StrictSums(ProceduralDomain):
        name, category = "test_strict", "test"

        def generate(self, rng, difficulty):
            return "answer as JSON", "1"

        def gold(self, task):
            return '{"answer": 1}'

    dom = StrictSums()
    dom.verifier = Strict()
    monkeypatch.setitem(DOMAINS, dom.name, dom)
    monkeypatch.setattr("posttrain.domains.registry.get", lambda name: DOMAINS[name])
    return dom


def test_a_verifier_that_raises_on_garbage_scores_it_0_and_the_old_rule_would_mask_it(strict_domain, monkeypatch):
    task = strict_domain.sample(0, "train", 1)
    hostile = generic()
    assert not unscored(task, hostile)
    v = judge(task, "[" * 100_000)
    assert v.score.value == 0.0 and v.fault.startswith("RecursionError") and v.error_kind is None
    assert judge(task, '{"answer": 1}').score.value == 1.0
    monkeypatch.setattr("posttrain.pipeline.workers.blame", capture)  # the old rule: blamed where it escaped
    assert len(unscored(task, hostile)) > len(hostile) // 2


def test_an_environment_that_raises_on_an_action_and_the_old_rule(monkeypatch):
    name = "tool_transfer"
    task = DOMAINS[name].sample(0, "train", 1)
    env_cls = DOMAINS[name].environment()

    class Trusting(env_cls):
        """The domain's environment, plus a step that trusts the action's JSON."""

        def step(self, action):
            json.loads(action)["name"].strip()
            return super().step(action)

    monkeypatch.setattr(DOMAINS[name], "environment", lambda: Trusting)
    plans = [["[" * 100_000], ["null"], ['{"name": 5}'], [DOMAINS[name].gold_turns(task)[0]]]
    group, stats = play_group(name, plans, task)
    assert not masked(group.rollouts, plans)
    assert [r.reward for r in group.rollouts[:3]] == [0.0] * 3 and stats.counters["model_faults"] == 3
    assert all(r.score.reason.startswith("model fault:") for r in group.rollouts[:3])
    assert group.rollouts[3].error is None
    monkeypatch.setattr("posttrain.envs.driver.blame", capture)  # the old rule: a step's escape is infra
    group, _ = play_group(name, plans, task)
    assert len(masked(group.rollouts, plans)) == 3


# ---- evaluation plays episodes through the same driver --------------------------

FAMILIES = (
    "code_revise",
    "doc_invoice_fields_md",
    "fin_income_fields",
    "geo_box",
    "lookup",
    "terminal",
    "tool_transfer",
)
"""One multi-turn domain of each environment family (the pipeline test above covers every one)."""


@pytest.mark.parametrize("name", FAMILIES)
def test_evaluation_plays_hostile_episodes_without_masking(name):
    from posttrain.evaluate.core import judge
    from posttrain.pipeline.play import Play

    dom = DOMAINS[name]
    task = dom.sample(0, "train", 1)
    plans = _plans(name, task, 3)
    budget = dataclasses.replace(dom.budget, turns=max(map(len, plans)) + 1)
    params = SamplingParams(n=len(plans), max_tokens=64)
    [run] = Play(PlanEngine(plans), params, {name: budget}).run([task])  # the evaluator's scheduler
    assert [v.error_kind for v in run.final] == [None] * len(plans)
    verdicts = [judge(task, v, e) for v, e in zip(run.final, run.episodes)]
    assert all(v.ok is not None for v in verdicts), [v.error for v in verdicts]
