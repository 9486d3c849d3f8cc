"""The replay buffer (trainer/replay.py) on its own: what enters (rare successes, mixed rewards,
domains), the capacity bound, eviction by age and by use, the per-step share, the deterministic
choice, and a state that round-trips through JSON (what the checkpoint carries)."""

from __future__ import annotations

import json

import pytest

from posttrain.configs import load_config
from posttrain.configs.trainer import ReplayConfig
from posttrain.errors import ConfigError
from posttrain.rollout import Rollout, rollout_id
from posttrain.trainer.batch import TrainRow
from posttrain.trainer.replay import ReplayBuffer, admits
from posttrain.types import Completion, Message, Score, Task, TaskMeta


def _group(gid: str, passes: list[bool], domain: str = "reverse") -> list[Rollout]:
    task = Task(f"{domain}:{gid}", domain, (Message("user", "ab="),), "ba", TaskMeta("train", 2, "test", "v1"))
    return [
        Rollout(
            task,
            Completion((1, 2), (3, 4 + i), "x", (-0.5, -1.25 - i), "stop", model_version=3),
            gid,
            Score(float(ok), passed=ok),
            id=rollout_id(gid, i),
        )
        for i, ok in enumerate(passes)
    ]


def _rows(group: list[Rollout]) -> tuple[TrainRow, ...]:
    return tuple(
        TrainRow.from_completion(r.completion, r.reward or 0.0, r.group_id, 1.0, rollout_id=r.id) for r in group
    )


def _buffer(**cfg) -> ReplayBuffer:
    return ReplayBuffer(ReplayConfig(enabled=True, **cfg), prompts_per_step=8)


RARE = [True, False, False, False, False, False, False, False]  # 1 of 8 passed


def test_what_enters_rare_successes_mixed_rewards_and_domains():
    rare = ReplayConfig(enabled=True)  # admit rare, rare_share 0.25
    assert admits(rare, _group("a", RARE))
    assert admits(rare, _group("b", [True, True, False, False, False, False, False, False]))  # 2 of 8 = 0.25
    assert not admits(rare, _group("c", [True, True, True, False, False, False, False, False]))  # 3 of 8
    assert not admits(rare, _group("d", [False] * 8)) and not admits(rare, _group("e", [True] * 8))  # no signal
    mixed = ReplayConfig(enabled=True, admit="mixed")
    assert admits(mixed, _group("f", [True] * 6 + [False] * 2)) and not admits(mixed, _group("g", [True] * 8))
    only = ReplayConfig(enabled=True, domains=("sort",))
    assert not admits(only, _group("h", RARE)) and admits(only, _group("i", RARE, domain="sort"))


def test_capacity_bounds_the_buffer_and_evicts_the_oldest():
    buf = _buffer(capacity=3)
    for step in range(1, 6):
        groups = [_group(f"{step}:{k}", RARE) for k in range(2)]
        assert buf.admit([(g, _rows(g)) for g in groups], step) == 2
        assert len(buf) <= 3
    assert [e.group_id for e in buf.entries] == ["4:1", "5:0", "5:1"]
    assert buf.counts["admitted"] == 10 and buf.counts["evicted_capacity"] == 7


def test_a_step_takes_its_share_and_entries_older_than_max_age_are_evicted():
    buf = _buffer(share=0.25, max_age=2, max_replays=5)  # round(0.25 x 8) = 2 groups a step
    assert buf.per_step == 2
    assert _buffer(share=0.01).per_step == 1  # at least one
    g = [_group(f"1:{k}", RARE) for k in range(3)]
    buf.admit([(x, _rows(x)) for x in g], 1)
    taken = buf.take(2)
    assert len(taken) == 2 and all(e.age(2) == 1 for e in taken)
    assert len(buf.take(3)) == 2  # the one not taken at step 2 first, then one taken once
    assert buf.take(4) == [] and len(buf) == 0 and buf.counts["evicted_age"] == 3  # age 3 > max_age 2


def test_least_replayed_then_newest_first_and_max_replays_removes():
    buf = _buffer(share=0.125, max_replays=2, max_age=10)  # 1 group a step
    buf.admit([(g, _rows(g)) for g in [_group("1:0", RARE)]], 1)
    buf.admit([(g, _rows(g)) for g in [_group("2:0", RARE)]], 2)
    order = [buf.take(s)[0].group_id for s in range(3, 7)]
    assert order == ["2:0", "1:0", "2:0", "1:0"]  # newest among the least replayed, each twice
    assert len(buf) == 0 and buf.counts["evicted_used"] == 2 and buf.counts["replayed"] == 4
    assert buf.take(7) == []


def test_the_state_round_trips_through_json_with_rows_and_behaviour_logprobs():
    buf = _buffer(share=0.125)
    g = _group("1:0", RARE)
    buf.admit([(g, _rows(g))], 1)
    buf.admit([(x, _rows(x)) for x in [_group("2:0", RARE)]], 2)
    buf.take(3)
    again = _buffer(share=0.125)
    again.load_state_dict(json.loads(json.dumps(buf.state_dict())))
    assert again.entries == buf.entries and again.counts == buf.counts
    assert again.entries[0].rows == _rows(g) and again.entries[0].rows[1].behaviour_logprobs == (-0.5, -2.25)
    assert [e.group_id for e in again.take(4)] == [e.group_id for e in buf.take(4)]


def test_the_config_is_off_by_default_and_checks_its_bounds():
    cfg = load_config(None, [])
    assert cfg.trainer.replay.enabled is False
    with pytest.raises(ConfigError, match="trainer.replay.share"):
        load_config(None, ["trainer.replay.share=0"])
    with pytest.raises(ConfigError, match="trainer.replay.admit"):
        load_config(None, ["trainer.replay.admit=often"])
