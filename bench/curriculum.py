"""Curriculum sampling against uniform level sampling, same compute, same run.

The learner is SIMULATED (a real model on this 2-core CPU cannot climb
reasoning-gym levels in minutes): each domain has a skill s; a sample of a
level-l task is solved with probability p = sigmoid(3 (s - l + 0.5)). Per
task the learner draws a group of G samples; like GRPO it learns only from
groups that are not all-right or all-wrong, s += lr * 4 * q (1 - q) with q the
group's success share. Everything else is real: the TaskPool draws real
reasoning-gym tasks (rg_* arithmetic family, 5 to 11 levels), the learner's
completions are the gold answer or a wrong one, the real verifier scores
them, and the pool observes those rewards. Both arms get the same number of
tasks and samples, run side by side in one process with the same seeds;
held-out pass rate is measured on eval-split tasks at each domain's hardest
level (sampled outcomes scored by the verifier, and the expected value).

    .venv/bin/python bench/curriculum.py [--tasks 1500] [--seeds 3]
"""

from __future__ import annotations

import argparse
import math
import random
import resource
import time

from posttrain.configs.tasks import TasksConfig
from posttrain.domains.base import stable_rng
from posttrain.domains.registry import get
from posttrain.tasks import TaskPool
from posttrain.types import Episode

FAMILY = ["rg_basic_arithmetic", "rg_chain_sum", "rg_products", "rg_bitwise_arithmetic", "rg_decimal_chain_sum"]
G = 8
LR = 0.05
EVAL_TASKS = 40


def p_solve(skill: float, level: int) -> float:
    return 1.0 / (1.0 + math.exp(-3.0 * (skill - level + 0.5)))


class Learner:
    def __init__(self, names: list[str]) -> None:
        self.skill = {n: 1.0 for n in names}
        self._scores: dict[tuple[str, bool], float] = {}
        self.groups = self.informative = 0

    def reward(self, task, correct: bool) -> float:
        key = (task.id, correct)
        if key not in self._scores:
            d = get(task.domain)
            self._scores[key] = d.score(task, Episode(d.gold(task) if correct else d.wrong(task))).value
        return self._scores[key]

    def practise(self, task, rng: random.Random) -> list[float]:
        p = p_solve(self.skill[task.domain], task.meta.difficulty)
        rewards = [self.reward(task, rng.random() < p) for _ in range(G)]
        q = sum(rewards) / G
        self.groups += 1
        self.informative += 0.0 < q < 1.0
        self.skill[task.domain] += LR * 4 * q * (1 - q)
        return rewards


def run_arm(curriculum: bool, tasks: int, seed: int) -> tuple[Learner, TaskPool]:
    config = TasksConfig.model_validate(
        {"domains": {n: {} for n in FAMILY}, "seed": seed, "curriculum": {"enabled": curriculum}}
    )
    pool, learner, rng = TaskPool(config), Learner(FAMILY), random.Random(seed)
    for _ in range(tasks // 8):
        for task in pool.draw(8):
            for r in learner.practise(task, rng):
                pool.observe(task, r)
    return learner, pool


def held_out(learner: Learner, seed: int) -> tuple[float, float]:
    """(sampled pass rate scored by the verifier, expected pass rate) at each domain's top level."""
    sampled, expected = [], []
    for name in FAMILY:
        d = get(name)
        rng = stable_rng("heldout", seed, name)
        p = p_solve(learner.skill[name], d.levels)
        for i in range(EVAL_TASKS):
            task = d.sample(i, "eval", d.levels)
            sampled.append(learner.reward(task, rng.random() < p))
        expected.append(p)
    return sum(sampled) / len(sampled), sum(expected) / len(expected)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=1500, help="tasks per arm (x G samples)")
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    print(f"family: {', '.join(f'{n} ({get(n).levels} levels)' for n in FAMILY)}")
    print(f"simulated learner, G={G}, lr={LR}, {args.tasks} tasks x {G} samples per arm\n")
    print(
        f"{'seed':>4} {'arm':<11} {'held-out@top':>12} {'expected':>9} {'mean skill':>10} {'informative':>11} "
        f"{'frontiers':>14} {'s':>6}"
    )
    totals = {True: [], False: []}
    for seed in range(args.seeds):
        for curriculum in (True, False):
            start = time.perf_counter()
            learner, pool = run_arm(curriculum, args.tasks, seed)
            sampled, expected = held_out(learner, seed)
            informative = learner.informative / learner.groups
            frontiers = "/".join(str(s["frontier"]) for s in pool.stats()["domains"].values())
            totals[curriculum].append((sampled, expected))
            arm = "curriculum" if curriculum else "uniform"
            print(
                f"{seed:>4} {arm:<11} {sampled:>12.3f} {expected:>9.3f} "
                f"{sum(learner.skill.values()) / len(FAMILY):>10.2f} "
                f"{informative:>11.2f} {frontiers:>14} {time.perf_counter() - start:>6.1f}"
            )
    mean = {k: (sum(a for a, _ in v) / len(v), sum(b for _, b in v) / len(v)) for k, v in totals.items()}
    print(
        f"\nmean held-out pass rate at the hardest level: curriculum {mean[True][0]:.3f} (expected "
        f"{mean[True][1]:.3f}), "
        f"uniform {mean[False][0]:.3f} (expected {mean[False][1]:.3f})"
    )
    if mean[False][1] > 0:
        print(f"ratio curriculum/uniform (expected): {mean[True][1] / mean[False][1]:.2f}x")
    print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
