"""The gold answer scores 1 through the training path, for every registered domain.

Multi-turn domains (an `environment()`): the gold trajectory (`Domain.gold_turns`), one
action per turn, emitted by a scripted engine and driven by the Pipeline exactly as in
training (first observation in the prompt, the environment stepped by envs.driver, the
execute stage, the verifier) scores 1.0. Single-turn domains: the single gold
completion, through the same Pipeline, scores 1.0.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "pipeline"))
from pipeline_testlib import ScriptedEngine  # noqa: E402

from posttrain.configs.pipeline import PipelineConfig
from posttrain.domains.registry import all_domains  # noqa: E402
from posttrain.pipeline import EmbeddedWorkers, Pipeline, Scheduler  # noqa: E402
from posttrain.types import SamplingParams  # noqa: E402

DOMAINS = all_domains()
MULTI = sorted(n for n, d in DOMAINS.items() if d.environment() is not None)
SINGLE = sorted(n for n, d in DOMAINS.items() if d.environment() is None)


def _tasks(name):
    d = DOMAINS[name]
    return [d.sample(i, "train", level) for i, level in enumerate(sorted({1, d.levels}))]


class GoldEngine(ScriptedEngine):
    """Emits each task's gold actions in order: the task is the one whose prompt opens
    the context, the turn is the number of assistant turns already in it."""

    def __init__(self, tasks):
        self.heads = sorted(((self._head(t), DOMAINS[t.domain].gold_turns(t)) for t in tasks), key=lambda x: -len(x[0]))
        super().__init__(self.gold)

    @staticmethod
    def _head(task) -> str:
        """The task's prompt as ScriptedEngine renders it (an assistant message closed by \x03)."""
        return "".join(f"<|{m.role}|>{m.content}" + ("\x03" if m.role == "assistant" else "") for m in task.prompt)

    def gold(self, context: str, j: int) -> str:
        found = next(((head, g) for head, g in self.heads if context.startswith(head)), None)
        if found is None:  # a StopIteration here would hang the pipeline's future, not fail the test
            raise AssertionError(f"no task's prompt opens the context {context[:200]!r}")
        head, turns = found
        # assistant turns already taken: the context after the prompt holds one
        # `<|assistant|>` per earlier turn plus the generation prompt of this one
        k = context[len(head) :].count("<|assistant|>") - 1
        return turns[min(k, len(turns) - 1)]


def _train_path(tasks):
    names = sorted({t.domain for t in tasks})
    cfg = PipelineConfig(execute_workers=4, backoff_s=0.0)
    sched = Scheduler(cfg, {n: 1.0 for n in names}, {n: DOMAINS[n].cost_class for n in names})
    engine = GoldEngine(tasks)

    async def go():
        async with Pipeline(cfg, EmbeddedWorkers(engine), SamplingParams(n=1, max_tokens=4096), sched, seed=0) as p:
            return await p.run_groups(tasks)

    return [g.rollouts[0] for g in asyncio.run(go())]


@pytest.mark.parametrize("name", MULTI)
def test_gold_trajectory_scores_1_through_the_training_pipeline(name):
    for r in _train_path(_tasks(name)):
        assert r.error is None, (r.task.id, r.error)
        gold = DOMAINS[name].gold_turns(r.task)
        assert r.timings["turns"] == len(gold), (r.task.id, [t.observation for t in r.turns])
        want = DOMAINS[name].gold_value(r.task)
        assert r.reward == want and r.score.passed, (r.task.id, r.score, [t.observation for t in r.turns])


def test_single_gold_completion_scores_1_through_the_training_pipeline():
    tasks = [t for n in SINGLE for t in _tasks(n)]
    bad = [
        (r.task.id, r.error or r.score.reason)
        for r in _train_path(tasks)
        if r.error is not None or r.reward != 1.0 or not r.score.passed
    ]
    assert not bad
