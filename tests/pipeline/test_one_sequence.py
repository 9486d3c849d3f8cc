"""One sequence for every scheduler (issue 36): the evaluator and every training scheduler give
the same outcome, sample by sample, for the same groups, because each group drives its own
sequence (`GroupRun`) and every scheduler batches generation through the one helper that
halves a failed engine call down to the group that failed it.

The groups: eight held-out `add` tasks (one engine call), one of whose prompts is too long
for the engine (`PromptTooLong`, never retried) and one of whose requests always fails for
the infrastructure (a `GenerationError`, retried, then masked). Blame by cause: those two
samples are masked, each alone; the other six are scored. The schedulers: the evaluator
(`evaluate_sets`), the staged pipeline (`pipeline.direct=false`), the direct path, and the
continuous stream (`pipeline.mode=async`, which runs through the staged pipeline).
"""

from __future__ import annotations

import re

import pytest
from pipeline_testlib import ScriptedEngine

from posttrain.configs.pipeline import PipelineConfig
from posttrain.configs.tasks import TasksConfig
from posttrain.errors import GenerationError, PromptTooLong
from posttrain.evaluate.core import evaluate_sets
from posttrain.evaluate.heldout import domain_set
from posttrain.pipeline import EmbeddedWorkers, StepRollouts
from posttrain.pipeline.continuous import Continuous
from posttrain.tasks.pool import TaskPool
from posttrain.types import SamplingParams

SET = domain_set("add", 1, 8, "core")
TASKS = SET.tasks()
LONG, BROKEN = TASKS[2].prompt[-1].content, TASKS[5].prompt[-1].content
CFG = dict(backoff_s=0.0, max_retries=1, generate_batch=8)


def answer(context: str, j: int) -> str:
    """The sum for even first operands, one more for odd ones: scored 1 and 0 both."""
    a, b = (int(x) for x in re.findall(r"(\d+)\+(\d+)=", context)[-1])
    return str(a + b + a % 2)


class FlakyEngine(ScriptedEngine):
    """A call whose requests hold the long prompt fails with PromptTooLong; one that holds the
    broken task's prompt fails for the infrastructure, every time."""

    def __init__(self) -> None:
        super().__init__(answer)

    def generate(self, requests):
        contexts = [self.decode(r.prompt_ids) for r in requests]
        if any(LONG in c for c in contexts):
            raise PromptTooLong(f"prompt of {max(map(len, contexts))} tokens over the engine's 20")
        if any(BROKEN in c for c in contexts):
            raise GenerationError("engine worker lost")
        return super().generate(requests)


def outcome(task_id: str, passed: bool | None) -> tuple[str, str]:
    return task_id, "masked" if passed is None else ("passed" if passed else "failed")


def evaluator() -> list[tuple[str, str]]:
    [result] = evaluate_sets(FlakyEngine(), {"add": SET}).values()
    return [outcome(tid, train_ok) for tid, _, train_ok in result.items]


def _pool() -> TaskPool:
    return TaskPool(TasksConfig.model_validate({"domains": {"add": {"difficulty": 1}}}), seed=0)


def _rows(groups) -> list[tuple[str, str]]:
    rows = {r.task.id: outcome(r.task.id, None if r.reward is None else r.reward > 0) for g in groups for r in g}
    return [rows[t.id] for t in TASKS]


def stepped(direct: bool) -> list[tuple[str, str]]:
    rollouts = StepRollouts(
        PipelineConfig(direct=direct, **CFG), EmbeddedWorkers(FlakyEngine()), _pool(), seed=0, dynamic_sampling=False
    )
    assert rollouts.direct is direct
    try:
        groups, _ = rollouts.sample(TASKS, SamplingParams(n=1, max_tokens=16), 1)
    finally:
        rollouts.close()
    return _rows(groups)


def streamed() -> list[tuple[str, str]]:
    cfg = PipelineConfig(mode="async", max_staleness=0, **CFG)
    stream = Continuous(cfg, EmbeddedWorkers(FlakyEngine()), _pool(), 0, len(TASKS), lambda: 0)
    try:
        groups, left, _ = stream.take(lambda k: TASKS[:k], SamplingParams(n=1, max_tokens=16), 1)
    finally:
        stream.close()
    assert not left
    return _rows(groups)


EXPECTED = [
    outcome(t.id, None if i in (2, 5) else int(re.findall(r"(\d+)\+", t.prompt[-1].content)[-1]) % 2 == 0)
    for i, t in enumerate(TASKS)
]


@pytest.mark.parametrize("scheduler", [evaluator, lambda: stepped(False), lambda: stepped(True), streamed])
def test_every_scheduler_masks_the_long_prompt_and_the_broken_call_alone(scheduler):
    assert {o for _, o in EXPECTED} == {"masked", "passed", "failed"}
    assert scheduler() == EXPECTED


def test_sampled_evaluation_scores_its_batch_mates_when_a_group_is_masked():
    """pass@k over sampled groups: the groups the engine could not serve are left out, the rest
    scored (a masked group has no episodes to read: this crashed on `run.n` before)."""
    from posttrain.evaluate.core import EvalOptions

    [result] = evaluate_sets(FlakyEngine(), {"add": SET}, EvalOptions(samples=2, ks=(1, 2)), ["core"]).values()
    mean, low, high = result.sampling["pass@1"]
    assert 0.0 < mean < 1.0 and low <= mean <= high  # even first operands pass, odd ones fail
