"""The pool's cached target shares and its tie-break: the same draws as computing both afresh
at every draw (the pool's behaviour before the cache), and a cache that follows every change."""

from __future__ import annotations

import dataclasses

from posttrain.configs.tasks import TasksConfig
from posttrain.domains.base import stable_hash
from posttrain.tasks.pool import TaskPool

DOMAINS = {
    "add": {"weight": 1.0},
    "sub": {"weight": 1.0},
    "reverse": {"weight": 2.0},
    "sort": {"weight": 1.0, "reward_weights": {"outcome": 1.0}},
}


class Afresh(TaskPool):
    """The shares computed at every call, every name's tie hash taken at every pick, every task's
    meta stamped anew."""

    def target_shares(self) -> dict[str, float]:
        raw = {n: (self.specs[n].weight * self.drift.boost(n)) ** (1.0 / self.config.temperature) for n in self.names}
        total = sum(raw.values())
        return {n: v / total for n, v in raw.items()}

    def _stamp(self, task):
        meta = dataclasses.replace(
            task.meta, taskset_version=self._versions[task.domain], reward_weights=self._weights[task.domain]
        )
        return dataclasses.replace(task, meta=meta)

    def _pick_domain(self, shares):
        shares = self.target_shares()
        for n in self.names:
            self._credit[n] += shares[n]
        name = max(self.names, key=lambda n: (self._credit[n], -stable_hash("tie", self.seed, self._draws, n)))
        self._credit[name] -= 1.0
        return name


def _pools(**config):
    cfg = TasksConfig.model_validate({"domains": DOMAINS, **config})
    return TaskPool(cfg, seed=7), Afresh(cfg, seed=7)


def _same_draws(a: TaskPool, b: TaskPool, n: int) -> None:
    assert a.draw(n) == b.draw(n)  # the same tasks, meta (task-set version, reward weights) included
    assert a.target_shares() == b.target_shares()


def test_cached_shares_draw_what_fresh_shares_draw_through_every_change():
    fast, fresh = _pools(temperature=0.7)
    _same_draws(fast, fresh, 50)  # equal weights tie often: the tie-break is exercised
    for pool in (fast, fresh):
        pool.set_weight("sort", 3.0)
    _same_draws(fast, fresh, 40)
    rates = [
        {"add": 0.9, "sub": 0.5, "reverse": 0.5, "sort": 0.5},
        {"add": 0.2, "sub": 0.7, "reverse": 0.7, "sort": 0.6},
    ]
    for r in rates:  # the drift guard boosts add: the shares move
        assert fast.observe_eval(r, dict.fromkeys(r, 10_000)) == fresh.observe_eval(r, dict.fromkeys(r, 10_000))
    assert fast.drift.boost("add") > 1.0
    _same_draws(fast, fresh, 40)
    for pool in (fast, fresh):
        pool.exclude("sub")
    _same_draws(fast, fresh, 40)
    state = fresh.state_dict()
    restored, other = _pools(temperature=0.7)
    restored.target_shares()  # cached before the state arrives
    restored.load_state_dict(state)
    other.load_state_dict(state)
    for pool in (restored, other):
        pool.exclude("sub")
        pool.set_weight("sort", 3.0)
    _same_draws(restored, fresh, 30)
    _same_draws(other, fast, 30)


def test_target_shares_follow_a_weight_change_and_are_a_copy():
    pool, _ = _pools()
    before = pool.target_shares()
    before["add"] = 99.0  # the caller's copy
    assert pool.target_shares()["add"] == 0.2
    pool.set_weight("add", 4.0)
    assert pool.target_shares()["add"] == 0.5
