"""The diversity reward within a group: novelty by hand, and the property that makes it unfarmable
(a diverse answer never overtakes one the verifier scored higher)."""

from __future__ import annotations

import random

import pytest

from posttrain.configs.rollout import DiversityRewardConfig
from posttrain.configs.trainer import EntropyBonusConfig
from posttrain.pipeline.countermeasures import Countermeasures, answer_novelty, diversity_bonuses, ngram_novelty
from posttrain.rollout import Rollout, informative
from posttrain.types import Completion, Score, Task, TaskMeta


def test_answer_novelty_by_hand():
    # answers 3, 3, 4, 5: the two 3s share theirs with 1 of 3 mates -> 1 - 1/3; 4 and 5 are alone -> 1
    assert answer_novelty(["3", "<answer>3</answer>", "4", "5"]) == pytest.approx([2 / 3, 2 / 3, 1.0, 1.0])
    assert answer_novelty(["7"] * 4) == [0.0] * 4  # a collapsed group: no one is novel
    assert answer_novelty(["7"]) == [0.0]


def test_ngram_novelty_by_hand():
    # bigrams: "abc" {ab, bc}, "abd" {ab, bd}, "xy" {xy}: abc's bc is its own (1/2), abd's bd (1/2), xy all
    assert ngram_novelty(["abc", "abd", "xy"], 2) == pytest.approx([0.5, 0.5, 1.0])
    assert ngram_novelty(["a", "aa"], 2) == [0.0, 1.0]


def test_bonus_capped_below_the_next_higher_reward_by_hand():
    # rewards 0, 0, 1 and novelty 1, 0, 1 at weight 0.8: the wrong ones may rise at most half the gap (0.5)
    assert diversity_bonuses([0.0, 0.0, 1.0], [1.0, 0.0, 1.0], 0.8) == pytest.approx([0.5, 0.0, 0.8])
    # partial credit 0.9 under 1.0: its cap is 0.05, however novel it is
    assert diversity_bonuses([0.9, 1.0], [1.0, 0.0], 1.0) == pytest.approx([0.05, 0.0])


def test_a_diverse_wrong_answer_never_beats_a_correct_one():
    rng = random.Random(0)
    for _ in range(2000):
        n = rng.randint(2, 9)
        rewards = [rng.choice([0.0, 0.25, 0.5, 0.9, 1.0, rng.random()]) for _ in range(n)]
        novelty = [rng.random() for _ in range(n)]
        shaped = [v + b for v, b in zip(rewards, diversity_bonuses(rewards, novelty, rng.uniform(0.0, 1.0)))]
        for a in range(n):
            for b in range(n):
                if rewards[a] < rewards[b]:
                    assert shaped[a] < shaped[b], (rewards, novelty, shaped)


def _rollout(text: str, reward: float, i: int, domain: str = "add") -> Rollout:
    task = Task("t", domain, (), "0", TaskMeta("train", 1, "test", "v"))
    comp = Completion((1,), (2, 3), text, (-0.1, -0.1), "stop")
    return Rollout(task, comp, "1:0", Score(reward), id=f"1:0/{i}")


def test_shape_keeps_the_verifier_reward_and_makes_all_wrong_groups_informative():
    cm = Countermeasures(EntropyBonusConfig(), DiversityRewardConfig(domains={"add": 0.2}))
    group = [_rollout("1", 0.0, 0), _rollout("1", 0.0, 1), _rollout("2", 0.0, 2)]
    assert not informative(group)
    shaped = cm.shape([group])[0]
    assert [r.reward for r in shaped] == [0.0, 0.0, 0.0]  # the verifier's, untouched
    assert [r.diversity_bonus for r in shaped] == pytest.approx([0.1, 0.1, 0.2])
    assert informative(shaped)
    other = [_rollout("1", 0.0, 0, "sub"), _rollout("2", 0.0, 1, "sub")]
    assert all(r.diversity_bonus is None for r in cm.shape([other])[0])  # weight 0 in sub


def test_raised_values_never_go_below_the_configured_ones():
    cm = Countermeasures(EntropyBonusConfig(coef=0.02), DiversityRewardConfig(weight=0.0))
    cm.raise_entropy("add", 0.01)
    cm.raise_diversity("add", 0.1)
    assert cm.entropy_coef("add") == 0.02 and cm.diversity_weight("add") == 0.1
    cm.raise_entropy("add", 0.05)
    assert cm.entropy_coef("add") == 0.05 and cm.entropy_coef("sub") == 0.02
    assert cm.row(["add", "sub"]) == {
        "entropy_bonus_coef": {"add": 0.05, "sub": 0.02},
        "diversity_weight": {"add": 0.1},
    }
