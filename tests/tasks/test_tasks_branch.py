"""Branching (tasks.branch, tasks/branch.py): tasks derived from the policy's own failed turns of
pyfunc_revise, queued in the task pool and drawn as groups of their own."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from posttrain.configs import load_config
from posttrain.configs.tasks import BranchConfig, DomainSpec, TasksConfig
from posttrain.domains import pyfunc
from posttrain.domains.base import Budget, play_actions
from posttrain.domains.registry import all_domains, get
from posttrain.envs.driver import turns_of
from posttrain.errors import ConfigError
from posttrain.rollout import Rollout, rollout_id
from posttrain.tasks import TaskPool
from posttrain.types import Completion, Episode, Message, to_dict

REVISE = get("pyfunc_revise")


def _pool(share: float = 0.5, max_turns: int = 2, **branch) -> TaskPool:
    spec = DomainSpec(difficulty=1, max_turns=max_turns)
    return TaskPool(TasksConfig(domains={"pyfunc_revise": spec}, branch=BranchConfig(share=share, **branch)), seed=3)


def _played(task, actions, score: bool = True, error_kind: str | None = None, sample: int = 0) -> Rollout:
    """A rollout of `actions` on `task` through pyfunc_revise's real environment (the sandbox runs the
    visible tests) and verifier (the hidden tests): what the pipeline hands the loop."""
    ep = play_actions(REVISE.environment()(), task, actions)
    s = REVISE.score(task, Episode(ep.completion, ep.turns)) if score else None
    c = Completion((), (1,), ep.completion, (0.0,), "stop")
    gid = f"1:{task.id}"
    return Rollout(task, c, gid, s, error_kind, turns=ep.turns, id=rollout_id(gid, sample))


def _bad_add(task) -> str:
    """A failed attempt of the model's own kind on an add_K task: subtracts (fails every test)."""
    return REVISE.wrong(task)


def _minus(task, j: int) -> str:
    """Another failed attempt on an add_K task: x - j (fails every test, K >= 2)."""
    return f"```python\ndef {task.reference.name}(x):\n    return x - {j}\n```"


def _root(pool: TaskPool):
    """A fresh level-1 task whose template's wrong body fails every hidden test (add: x - k vs x + k)."""
    for _ in range(200):
        (task,) = pool.draw(1)
        if task.reference.name.startswith("add_"):
            return task
    raise AssertionError("no add task drawn")


def test_a_failed_episode_gives_the_loop_from_its_own_second_turn():
    pool = _pool()
    root = _root(pool)
    failed = _played(root, [_bad_add(root), _bad_add(root)])
    assert failed.score is not None and not failed.score.passed and len(failed.turns) == 2
    assert pool.offer([[failed]]) == 1 and len(pool.branch) == 1
    derived = pool.draw(2)[-1]  # share 0.5 of 2 prompts: the second is the derived task
    # the prompt: the request, the model's own attempt (assistant), what the visible tests observed (tool)
    assert derived.prompt[:1] == root.prompt
    assert [m.role for m in derived.prompt] == ["user", "assistant", "tool"]
    assert derived.prompt[1].content == failed.turns[0].action
    assert derived.prompt[2].content == failed.turns[0].observation
    assert derived.prompt[2].content.endswith(pyfunc.ASK_REVISION) and "FAILED" in derived.prompt[2].content
    # the same hidden-test verifier (the reference is the root's), a train task, the remaining turn as its budget
    assert derived.reference is root.reference and derived.domain == "pyfunc_revise"
    assert derived.meta.split == "train" and derived.meta.branched == 1 and derived.id != root.id
    assert turns_of(REVISE, Budget(turns=2), derived) == 1
    gold = play_actions(REVISE.environment()(), derived, [REVISE.gold(derived)])
    assert REVISE.score(derived, gold).passed
    # cheats still refused: handing the failed attempt back scores 0 and is one of the declared cheats
    back = play_actions(REVISE.environment()(), derived, [derived.prompt[1].content])
    handed = REVISE.score(derived, back)
    assert handed.value == 0.0 and not handed.passed
    assert derived.prompt[1].content in REVISE.cheats(derived)
    # the derived task's statement is the root's: held out (or not) with it, never an eval item
    assert pyfunc.split_of("pyfunc", pyfunc._split_key(derived.prompt[0].content)) == "train"
    assert to_dict(derived.meta)["branched"] == 1 and "branched" not in to_dict(root.meta)


def test_no_task_from_a_passed_a_masked_or_a_one_turn_episode():
    pool = _pool()
    root = _root(pool)
    passed = _played(root, [REVISE.gold(root)])
    fixed = _played(root, [_bad_add(root), REVISE.gold(root)])  # revised to a pass: nothing to learn from
    masked = _played(root, [_bad_add(root), _bad_add(root)], score=False, error_kind="sandbox")
    one = _played(root, [_bad_add(root)])  # its only turn (the budget, or a truncated answer)
    assert fixed.score.passed and not one.score.passed
    assert pool.offer([[passed, fixed], [masked], [one]]) == 0 and len(pool.branch) == 0
    assert pool.branch.counts["refused_masked"] == 1  # blame by cause: an infra error is never training data
    # an eval task never gives one either (not a training episode)
    held = REVISE.sample(0, "eval", 1)
    assert pool.offer([[_played(held, [REVISE.wrong(held), REVISE.wrong(held)])]]) == 0


def test_a_derived_task_of_a_derived_task_is_bounded_by_the_turn_budget():
    pool = _pool(share=1.0, max_turns=3)
    root = _root(pool)
    pool.offer([[_played(root, [_bad_add(root)] * 3)]])
    (first,) = pool.draw(1)
    assert first.meta.branched == 1
    pool.offer([[_played(first, [_bad_add(root)] * 2)]])  # 2 turns left: one more derivation
    (second,) = pool.draw(1)
    assert second.meta.branched == 2 and second.prompt[: len(first.prompt)] == first.prompt
    assert turns_of(REVISE, Budget(turns=3), second) == 1
    # a derivation that would leave no turn is refused (a transcript longer than the budget allows)
    assert pool.offer([[_played(second, [_bad_add(root)] * 2)]]) == 0
    assert pool.branch.counts["refused_budget"] == 1


def test_share_bounds_each_draw_and_max_queue_the_queue():
    pool = _pool(share=0.5, max_queue=3)
    root = _root(pool)
    bad = [_played(root, [_minus(root, j)] * 2, sample=j) for j in range(6)]  # six different failed attempts
    # per_group 1: one derived task per group; 5 groups, max_queue 3: the 2 oldest are pushed out
    groups = [[bad[0], bad[1]], [bad[2]], [bad[3]], [bad[4]], [bad[5]]]
    assert pool.offer(groups) == 5 and len(pool.branch) == 3 and pool.branch.counts["pushed_out"] == 2
    assert pool.offer([[bad[5]]]) == 0 and pool.branch.counts["duplicate"] == 1  # queued once
    assert sum(t.meta.branched > 0 for t in pool.draw(1)) == 0  # floor(0.5 x 1) = 0
    assert [t.meta.branched > 0 for t in pool.draw(4)] == [False, False, True, True]
    assert [t.meta.branched > 0 for t in pool.draw(4)] == [False, False, False, True]  # the queue ran dry
    pool.offer([[bad[0]]])
    pool.exclude("pyfunc_revise")  # the monitor's exclude: its queued tasks are not drawn either
    assert pool.branch.take(4, pool.names) == [] and pool.branch.counts["excluded"] == 1
    off = _pool(share=0.0)
    root = _root(off)
    assert off.offer([[_played(root, [_bad_add(root)] * 2)]]) == 0 and off.branch.row() == {}


def test_resume_with_a_non_empty_queue_draws_the_same_tasks():
    pool = _pool(share=0.5)
    root = _root(pool)
    assert pool.offer([[_played(root, [_minus(root, j)] * 2)] for j in range(3)]) == 3
    state = json.loads(json.dumps(pool.state_dict()))  # a checkpoint is JSON
    assert len(state["branch"]["queue"]) == 3
    resumed = _pool(share=0.5)
    resumed.load_state_dict(state)
    a, b = pool.draw(4), resumed.draw(4)
    assert [t.id for t in a] == [t.id for t in b] and [t.prompt for t in a] == [t.prompt for t in b]
    assert sum(t.meta.branched for t in b) == 2 and a[-1].meta == b[-1].meta
    # a checkpoint from before branching: an empty queue
    old = {k: v for k, v in state.items() if k != "branch"}
    empty = _pool(share=0.5)
    empty.load_state_dict(old)
    assert len(empty.branch) == 0


def test_branching_off_leaves_the_task_set_version_as_before():
    spec = {"pyfunc_revise": DomainSpec(difficulty=1)}
    plain = TaskPool(TasksConfig(domains=spec), seed=3)
    off = TaskPool(TasksConfig(domains=spec, branch=BranchConfig(share=0.0, max_queue=9)), seed=3)
    on = TaskPool(TasksConfig(domains=spec, branch=BranchConfig(share=0.5)), seed=3)
    assert plain.taskset_version == off.taskset_version != on.taskset_version


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("tasks.branch.share=1.5", "tasks.branch.share"),
        ("tasks.branch.share=-0.1", "tasks.branch.share"),
        ("tasks.branch.max_queue=0", "tasks.branch.max_queue"),
        ("tasks.branch.per_group=0", "tasks.branch.per_group"),
        ("tasks.branch.shares=0.5", "tasks.branch.shares"),
    ],
)
def test_bad_branch_config_is_one_error_naming_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_config(None, [override])
    assert load_config(None, ["tasks.branch={share: 0.5, max_queue: 8}"]).tasks.branch.share == 0.5


@pytest.mark.parametrize("name", sorted(n for n, d in all_domains().items() if d.branches))
def test_every_branching_domain_derives_a_task_its_gold_still_solves(name):
    """The hook's contract, for every registered domain that implements it: from a failed two-turn
    episode of its wrong answer, the derived task holds the attempt and its observation, its gold
    still scores its gold value through the environment, and the attempt handed back is refused."""
    domain = get(name)
    task = domain.sample(0, "train", 1)
    ep = play_actions(domain.environment()(), task, [domain.wrong(task), domain.wrong(task)])
    assert not domain.score(task, ep).passed and domain.branch_at(task, ep.turns) == 1
    derived = domain.branched(task, [(t.action, t.observation) for t in ep.turns[:1]])
    assert derived.prompt[-2:] == (Message("assistant", domain.wrong(task)), Message("tool", ep.turns[0].observation))
    assert derived.reference is task.reference and derived.meta.branched == task.meta.branched + 1
    gold = play_actions(domain.environment()(), derived, domain.gold_turns(derived))
    assert domain.score(derived, gold).value == domain.gold_value(derived)
    back = play_actions(domain.environment()(), derived, [domain.wrong(task)])
    assert not domain.score(derived, back).passed and domain.wrong(task) in domain.cheats(derived)


def test_baseline_fresh_judges_the_revisions_against_a_fresh_first_attempt():
    """tasks.branch.baseline: fresh. The derived task carries what a fresh first attempt earned in the
    group its failure came from (episodes that ended at their first turn, the others counted 0; a masked
    episode not counted); its rows carry it to the trainer, a group of revisions all below it carries
    signal, and a resumed queue rebuilds it. baseline: group (the default) leaves the task as before."""
    from posttrain.rollout import informative
    from posttrain.tasks.branch import Origin, fresh_reward
    from posttrain.trainer.batch import rows_of

    pool = _pool(share=1.0, baseline="fresh")
    root = _root(pool)
    passed = _played(root, [REVISE.gold(root)], sample=0)  # a first attempt that passed: reward 1
    failed = [_played(root, [_minus(root, j)] * 2, sample=j) for j in (1, 2, 3)]  # failed twice: 0
    masked = _played(root, [_bad_add(root)] * 2, score=False, error_kind="sandbox", sample=4)
    group = [failed[0], passed, *failed[1:], masked]
    assert fresh_reward(group) == pytest.approx(1 / 4) and fresh_reward([masked]) is None
    fixed = _played(root, [_bad_add(root), REVISE.gold(root)], sample=5)  # passed at turn 2: 0 for a first attempt
    assert fresh_reward([passed, fixed]) == pytest.approx(1 / 2)
    assert pool.offer([group]) == 1
    (derived,) = pool.draw(1)
    assert derived.meta.branched == 1 and derived.meta.baseline == pytest.approx(0.25)
    assert to_dict(derived.meta)["baseline"] == pytest.approx(0.25) and "baseline" not in to_dict(root.meta)
    # its revisions: all fail (reward 0, below the baseline): a signal; rows carry the baseline
    revisions = [_played(derived, [_minus(root, j)], sample=j) for j in range(3)]
    assert {r.train_reward for r in revisions} == {0.0} and informative(revisions)
    prompted = [replace(r, completion=replace(r.completion, prompt_ids=(7,))) for r in revisions]
    assert [row.baseline for row in rows_of(prompted, 1.0)] == [0.25] * 3
    assert not informative([_played(root, [_minus(root, j)] * 2, sample=j) for j in range(3)])  # no baseline
    # resume: the queue's JSON keeps the baseline; a 4-field origin (before baselines) reads as None
    pool.offer([group])
    state = json.loads(json.dumps(pool.state_dict()))
    resumed = _pool(share=1.0, baseline="fresh")
    resumed.load_state_dict(state)
    assert resumed.draw(1)[0].meta == pool.draw(1)[0].meta
    assert Origin.from_json(["pyfunc_revise", 3, 1, []]).baseline is None
    with pytest.raises(ValueError, match="4 or 5 fields"):
        Origin.from_json(["pyfunc_revise", 3, 1, [], 0.5, 1])
    # the default: no baseline on the derived task
    plain = _pool(share=1.0)
    root = _root(plain)
    plain.offer([[_played(root, [_bad_add(root)] * 2)]])
    assert plain.draw(1)[0].meta.baseline is None
