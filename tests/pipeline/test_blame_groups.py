"""Masking reaches one sample, never its group-mates or its engine batch.

An infra failure of one episode's step, or of one completion's run, masks that sample
after its retries; its mates are scored and the group still trains on them (advantages
over the scored samples). A model fault next to it is scored 0. An engine call that fails
over several groups is split until the failing group stands alone: a prompt over the
model's positions masks its own group (kind "prompt", not retried) and no other, in the
staged pipeline and on the direct path alike. (Before issue 24, each of these masked the
whole group, or every group of the engine call.)
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from hostile import PlanEngine
from pipeline_testlib import ScriptedEngine

from posttrain.configs.pipeline import PipelineConfig
from posttrain.domains.registry import get
from posttrain.errors import PromptTooLong, SandboxError
from posttrain.pipeline import EmbeddedWorkers, Pipeline, Scheduler
from posttrain.pipeline.direct import Direct
from posttrain.rollout import informative
from posttrain.types import Message, SamplingParams

CFG = PipelineConfig(execute_workers=4, backoff_s=0.0, max_retries=2)


def _pipeline(workers, tasks, params, cfg=CFG):
    names = sorted({t.domain for t in tasks})
    sched = Scheduler(cfg, dict.fromkeys(names, 1.0), {n: get(n).cost_class for n in names})

    async def go():
        async with Pipeline(cfg, workers, params, sched, seed=0) as pipe:
            return await pipe.run_groups(tasks), pipe.stats().counters

    return asyncio.run(go())


def _rows(groups):
    """The trainer's rows of `groups` (trainer.batch.batch_of: one per scored rollout)."""
    from posttrain.trainer.batch import batch_of

    return batch_of(groups, 1.0).rows


def test_one_episodes_sandbox_failure_masks_it_alone(monkeypatch):
    name = "tool_transfer"
    dom = get(name)
    task = dom.sample(0, "train", 1)
    gold = dom.gold_turns(task)
    base = dom.environment()

    class SandboxDiesOnDie(base):
        def step(self, action):
            if action == "die":
                raise SandboxError("the tool sandbox died")
            return super().step(action)

    monkeypatch.setattr(dom, "environment", lambda: SandboxDiesOnDie)
    plans = [[gold[0], "die"], gold, gold, ["[" * 100_000]]
    [group], counters = _pipeline(EmbeddedWorkers(PlanEngine(plans)), [task], SamplingParams(n=4, max_tokens=512))
    died, *mates = group.rollouts
    assert died.reward is None and died.error_kind == "sandbox" and "died" in died.error
    assert [r.reward for r in mates] == [1.0, 1.0, 0.0] and all(r.error_kind is None for r in mates)
    assert counters["masked_rollouts"] == 1 and counters["masked_groups"] == 0
    assert counters["retries"] == CFG.max_retries  # the one failing step was retried, then masked
    assert informative(group.rollouts) and len(_rows([list(group.rollouts)])) == 3


def test_one_completions_failed_run_masks_it_alone():
    seen = []

    def execute(task, completion):
        seen.append(completion.text)
        if completion.text == "die":
            raise SandboxError("sandbox worker died")
        if completion.text == "1e309":
            raise OverflowError("cannot convert float infinity to integer")  # the model's output broke the step
        return None

    tasks = [get("add").sample(0, "train", 1)]
    answer = str(tasks[0].reference)
    texts = ["die", "1e309", f"<answer>{answer}</answer>", "<answer>-1</answer>"]
    engine = ScriptedEngine(lambda context, j: texts[j])
    [group], counters = _pipeline(EmbeddedWorkers(engine, execute), tasks, SamplingParams(n=4, max_tokens=32))
    assert [r.error_kind for r in group.rollouts] == ["sandbox", None, None, None]
    assert [r.reward for r in group.rollouts][1:] == [0.0, 1.0, 0.0]
    assert seen.count("die") == CFG.max_retries + 1 and seen.count(texts[2]) == 1  # only the failed run re-ran
    assert counters["masked_execute"] == 1 and counters["model_faults"] == 1 and counters["masked_groups"] == 0


@pytest.fixture
def oversized(micro_base):
    """The HF engine on the micro base, three tasks, and a fourth whose prompt is longer
    than the model's positions."""
    from posttrain.engine.hf import HFEngine

    engine = HFEngine.from_pretrained(micro_base, seed=0)
    tasks = [get("add").sample(i, "train", 1) for i in range(3)]
    big = dataclasses.replace(tasks[0], id="add:oversized", prompt=(Message("user", "1+1=" * 4096),))
    return engine, [tasks[0], big, tasks[1], tasks[2]]


def test_a_prompt_over_the_models_positions_masks_its_own_group_only(oversized):
    engine, tasks = oversized
    params = SamplingParams(n=2, max_tokens=4)
    staged, counters = _pipeline(EmbeddedWorkers(engine), tasks, params, PipelineConfig(generate_batch=4))
    cfg = PipelineConfig(generate_batch=4, direct=True)
    sched = Scheduler(cfg, {"add": 1.0}, {"add": "short"})
    direct_run = Direct(cfg, EmbeddedWorkers(engine), params, sched, seed=0)
    direct = direct_run.run_groups(tasks)
    for groups, c in ((staged, counters), (direct, direct_run.counters)):
        kinds = [[r.error_kind for r in g.rollouts] for g in groups]
        assert kinds == [[None, None], ["prompt", "prompt"], [None, None], [None, None]]
        assert "max_position_embeddings" in groups[1].rollouts[0].error
        assert c["retries"] == 0 and c["generate_splits"] >= 1 and c["masked_groups"] == 1
    assert [[r.completion.token_ids for r in g.rollouts] for g in staged] == [
        [r.completion.token_ids for r in g.rollouts] for g in direct
    ]


def test_model_faults_do_not_pause_a_domain_and_a_failing_sandbox_still_does(monkeypatch):
    """degrade_after=1: one infra-failed group pauses its domain; groups of model faults never do."""
    from posttrain.domains import registry
    from posttrain.domains.base import ProceduralDomain
    from posttrain.types import Score

    class Trusting:
        """Parses the answer as an integer: raises on anything else (a model fault), never on the gold."""

        name, version = "trusting", "1"

        def score(self, task, episode):
            ok = int(episode.completion.strip()) == int(task.reference)
            return Score(float(ok), passed=ok)

    class Sums(ProceduralDomain):
        name, category = "test_trusting", "test"

        def generate(self, rng, difficulty):
            return f"{rng.randint(0, 9)}+1=", "0"

        def gold(self, task):
            return str(task.reference)

    dom = Sums()
    dom.verifier = Trusting()
    monkeypatch.setitem(registry._REGISTRY, dom.name, dom)
    cfg = PipelineConfig(degrade_after=1, degrade_cooldown_s=600.0, backoff_s=0.0, max_retries=0)
    tasks = [dom.sample(i, "train", 1) for i in range(3)]

    def run(execute=None):
        engine = ScriptedEngine(lambda context, j: ["1e309", "NaN", "[" * 100_000, "0"][j])
        sched = Scheduler(cfg, {dom.name: 1.0}, {dom.name: "short"})
        workers = EmbeddedWorkers(engine, execute) if execute else EmbeddedWorkers(engine)

        async def go():
            async with Pipeline(cfg, workers, SamplingParams(n=4, max_tokens=8), sched, seed=0) as pipe:
                return await pipe.run_groups(tasks), pipe.stats().counters, sched.mix()[dom.name]

        return asyncio.run(go())

    groups, counters, mix = run()
    assert all([r.reward for r in g.rollouts] == [0.0, 0.0, 0.0, 1.0] for g in groups)
    assert counters["model_faults"] == 9 and mix["paused"] == 0.0 and mix["alarms"] == 0

    def dies_once_per_group(task, completion):
        if completion.text == "0":
            raise SandboxError("sandbox worker died")

    groups, counters, mix = run(dies_once_per_group)
    assert groups[0] is not None and [r.error_kind for r in groups[0].rollouts] == [None, None, None, "sandbox"]
    assert mix["paused"] == 1.0 and mix["alarms"] >= 1  # the sandbox failed: the domain pauses


class ShortContext(PlanEngine):
    """A PlanEngine with the HF engine's bound: a request whose context is `limit` tokens or
    more raises PromptTooLong (the engine seam; HFEngine._validate is tested in tests/engine)."""

    def __init__(self, plans, limit):
        super().__init__(plans)
        self.limit = limit

    def generate(self, requests):
        for req in requests:
            if len(req.prompt_ids) >= self.limit:
                raise PromptTooLong(f"prompt of {len(req.prompt_ids)} tokens; max_position_embeddings is {self.limit}")
        return super().generate(requests)


def test_an_episode_that_outgrows_the_context_ends_alone_as_truncated():
    dom = get("lookup")
    task = dom.sample(0, "train", 1)
    gold = dom.gold_turns(task)
    plans = [["A" * 3000], gold, gold]
    engine = ShortContext(plans, limit=3000)
    [group], counters = _pipeline(EmbeddedWorkers(engine), [task], SamplingParams(n=3, max_tokens=16))
    long, *mates = group.rollouts
    assert long.reward is not None and long.completion.finish_reason == "length" and long.timings["turns"] == 1.0
    assert [r.reward for r in mates] == [1.0, 1.0] and counters["masked_rollouts"] == 0
    engine = ShortContext([gold, gold], limit=10)  # the task's own prompt does not fit: masked as the prompt's
    [group], counters = _pipeline(EmbeddedWorkers(engine), [task], SamplingParams(n=2, max_tokens=16))
    assert [r.error_kind for r in group.rollouts] == ["prompt", "prompt"] and counters["retries"] == 0
