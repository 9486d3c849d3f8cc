"""StepRollouts registers every task it is given or draws in its ledger: each bound to the group
made from it, or dropped as "paused" when the pipeline skips it, on both paths; the replacement
rounds' draws continue the step's numbering."""

from __future__ import annotations

import pytest
from pipeline_testlib import ScriptedEngine
from test_pipeline_direct import FAST, _pool

from posttrain.configs.pipeline import PipelineConfig
from posttrain.pipeline import EmbeddedWorkers, StepRollouts
from posttrain.types import SamplingParams


@pytest.mark.parametrize("direct", [True, False])
def test_a_paused_domains_draws_are_dropped_and_the_rest_bound_to_their_groups(direct):
    pool = _pool(("add", "reverse"))
    engine = ScriptedEngine(lambda context, j: "1" if j % 2 else "10")
    rollouts = StepRollouts(
        PipelineConfig(direct=direct, degrade_after=1, degrade_cooldown_s=3600, **FAST),
        EmbeddedWorkers(engine),
        pool,
        seed=5,
    )
    try:
        rollouts.scheduler.record_verification("reverse", failed=True)  # paused for an hour
        assert rollouts.scheduler.is_paused("reverse") and rollouts.direct is direct
        tasks = pool.draw(8)
        groups, _ = rollouts.sample(tasks, SamplingParams(n=2, max_tokens=4), 3)
    finally:
        rollouts.close()
    ledger = rollouts.ledger
    assert {t.domain for t in tasks} == {"add", "reverse"}
    bound = {g[0].group_id: ledger.draw_of(g[0].group_id) for g in groups}
    assert len(groups) == sum(t.domain == "add" for t in tasks) and None not in bound.values()
    # the draws still open are exactly the returned groups'; the paused ones have their fate
    assert sorted(ledger.open()) == sorted(bound.values())
    dirty = ledger._dirty
    paused = [d for d in dirty.values() if d.fate == "dropped"]
    assert [d.reason for d in paused] == ["paused"] * sum(t.domain == "reverse" for t in tasks)
    assert all(d.domain == "reverse" and d.fate_step == 3 and d.group_id is None for d in paused)
    assert sorted(dirty) == sorted(f"d3.{k}" for k in range(8))  # one id per task, in draw order
    assert [dirty[f"d3.{k}"].task_id for k in range(8)] == [t.id for t in tasks]


def test_replacement_rounds_continue_the_steps_draw_numbering():
    pool = _pool(("add",))
    engine = ScriptedEngine(lambda context, j: "10")  # every group's rewards equal: all replaced
    rollouts = StepRollouts(PipelineConfig(replace_rounds=2, **FAST), EmbeddedWorkers(engine), pool, seed=5)
    try:
        groups, stats = rollouts.sample(pool.draw(3), SamplingParams(n=2, max_tokens=4), 1)
    finally:
        rollouts.close()
    assert stats["pipe_replaced"] == 6 and len(groups) == 9
    ids = sorted(rollouts.ledger.open(), key=lambda d: int(d.split(".")[1]))
    assert ids == [f"d1.{k}" for k in range(9)]
    assert sorted(rollouts.ledger.draw_of(g[0].group_id) for g in groups) == sorted(ids)
