"""Curriculum: difficulty tiers by online pass rate per (domain, level).

Invariant: each domain has one frontier level, 1 <= frontier <= levels; it
moves by one level at a time, only after `min_samples` observations at the
current frontier since its last move (hysteresis), up when the frontier's
pass rate reaches `promote_at`, down when it falls to `demote_at`. Draws
come from three tiers: warm-up (frontier - 1), frontier, hard (frontier + 1);
a tier that does not exist gives its share to the frontier.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Mapping
from typing import Any

from posttrain.configs.tasks import CurriculumConfig


class Curriculum:
    def __init__(self, config: CurriculumConfig, levels: Mapping[str, int]) -> None:
        self.config = config
        self.levels = dict(levels)
        self.frontier = {n: 1 for n in self.levels}
        self.highest = {n: 1 for n in self.levels}
        self.since_change = {n: 0 for n in self.levels}
        self.windows: dict[str, dict[int, deque[float]]] = {n: {} for n in self.levels}
        self.totals: dict[str, dict[int, list[float]]] = {n: {} for n in self.levels}

    def choose(self, name: str, rng: random.Random) -> int:
        """A level for the next draw of `name`."""
        top = self.levels[name]
        if not self.config.enabled:
            return rng.randint(1, top)
        f = self.frontier[name]
        u = rng.random()
        if u < self.config.warmup_share and f > 1:
            return f - 1
        if u >= 1.0 - self.config.hard_share and f < top:
            return f + 1
        return f

    def pass_rate(self, name: str, level: int) -> float | None:
        window = self.windows[name].get(level)
        return sum(window) / len(window) if window else None

    def observe(self, name: str, level: int, reward: float) -> None:
        window = self.windows[name].setdefault(level, deque(maxlen=self.config.window))
        window.append(reward)
        total = self.totals[name].setdefault(level, [0, 0.0])
        total[0] += 1
        total[1] += reward
        if self.config.enabled and level == self.frontier[name]:
            self.since_change[name] += 1
            self._maybe_move(name)

    def _maybe_move(self, name: str) -> None:
        if self.since_change[name] < self.config.min_samples:
            return
        f = self.frontier[name]
        rate = self.pass_rate(name, f) or 0.0
        if rate >= self.config.promote_at and f < self.levels[name]:
            self._move(name, f + 1)
        elif rate <= self.config.demote_at and f > 1:
            self._move(name, f - 1)

    def _move(self, name: str, level: int) -> None:
        self.frontier[name] = level
        self.highest[name] = max(self.highest[name], level)
        self.since_change[name] = 0

    def highest_frontier(self, name: str) -> int:
        return self.highest[name]

    def domain_stats(self, name: str) -> dict[str, Any]:
        tiers = {}
        for level in sorted(self.totals[name]):
            n, s = self.totals[name][level]
            tiers[str(level)] = {
                "observed": int(n),
                "mean_reward": s / n if n else None,
                "recent_pass_rate": self.pass_rate(name, level),
            }
        return {
            "frontier": self.frontier[name],
            "highest_frontier": self.highest[name],
            "levels": self.levels[name],
            "tiers": tiers,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "frontier": dict(self.frontier),
            "highest": dict(self.highest),
            "since_change": dict(self.since_change),
            "windows": {n: {str(lv): list(w) for lv, w in ws.items()} for n, ws in self.windows.items()},
            "totals": {n: {str(lv): list(t) for lv, t in ts.items()} for n, ts in self.totals.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for key in ("frontier", "highest", "since_change"):
            getattr(self, key).update({n: int(v) for n, v in state[key].items() if n in self.levels})
        maxlen = self.config.window
        self.windows = {n: {} for n in self.levels}
        for n, ws in state["windows"].items():
            if n in self.levels:
                self.windows[n] = {int(lv): deque(map(float, w), maxlen=maxlen) for lv, w in ws.items()}
        self.totals = {n: {} for n in self.levels}
        for n, ts in state["totals"].items():
            if n in self.levels:
                self.totals[n] = {int(lv): [int(t[0]), float(t[1])] for lv, t in ts.items()}
