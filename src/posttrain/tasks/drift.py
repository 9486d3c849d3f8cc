"""Drift guard: notices a domain regressing on held-out while others improve.

Invariant: a domain's boost is >= 1 and <= max_boost; it grows (x boost) only
at an evaluation where that domain is below its best held-out pass rate by
more than `tolerance` and by more than sampling noise (`drop_margin`, when the
evaluation's item counts are given) while the mean change of the other domains since the
previous evaluation is positive, and shrinks (x decay, floor 1) once the
domain is back within tolerance of its best.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from posttrain.configs.tasks import DriftConfig

_MAX_EVENTS = 50


def drop_margin(best: float, n_best: int | None, now: float, n_now: int | None, z: float) -> float:
    """The drop from `best` to `now` that sampling noise alone explains at `z` standard errors
    (two independent binomial proportions); 0 when either count is unknown."""
    if not n_best or not n_now:
        return 0.0
    return z * math.sqrt(best * (1.0 - best) / n_best + now * (1.0 - now) / n_now)


class DriftGuard:
    def __init__(self, config: DriftConfig, names: Sequence[str]) -> None:
        self.config = config
        self.names = tuple(names)
        self._boost = {n: 1.0 for n in self.names}
        self._best: dict[str, float] = {}
        self._best_n: dict[str, int] = {}
        self._last: dict[str, float] = {}
        self._evals = 0
        self._events: list[dict[str, Any]] = []

    def boost(self, name: str) -> float:
        return self._boost[name]

    def observe(self, rates: Mapping[str, float], counts: Mapping[str, int] | None = None) -> list[str]:
        """One evaluation's held-out pass rates (and, optionally, how many items each rests on);
        returns the domains boosted now."""
        rates = {n: float(v) for n, v in rates.items()}
        counts = dict(counts or {})
        boosted = []
        if self.config.enabled:
            for name, rate in sorted(rates.items()):
                if self._regressing(name, rate, rates, counts.get(name)):
                    new = min(self._boost[name] * self.config.boost, self.config.max_boost)
                    if new > self._boost[name]:
                        boosted.append(name)
                        self._event(name, rate, new)
                    self._boost[name] = new
                elif name in self._best and rate >= self._best[name] - self.config.tolerance:
                    self._boost[name] = max(1.0, self._boost[name] * self.config.decay)
        for name, rate in rates.items():
            if rate >= self._best.get(name, rate):
                self._best[name] = rate
                self._best_n[name] = int(counts.get(name, 0))
        self._last.update(rates)
        self._evals += 1
        return boosted

    def _regressing(self, name: str, rate: float, rates: Mapping[str, float], n: int | None) -> bool:
        if name not in self._best:
            return False
        best = self._best[name]
        noise = drop_margin(best, self._best_n.get(name), rate, n, self.config.z)
        if best - rate <= max(self.config.tolerance, noise):
            return False
        others = [rates[o] - self._last[o] for o in rates if o != name and o in self._last]
        return bool(others) and sum(others) / len(others) > 0.0

    def _event(self, name: str, rate: float, boost: float) -> None:
        self._events.append(
            {"eval": self._evals, "domain": name, "pass_rate": rate, "best": self._best[name], "boost": boost}
        )
        del self._events[:-_MAX_EVENTS]

    def events(self) -> list[dict[str, Any]]:
        return list(self._events)

    def state_dict(self) -> dict[str, Any]:
        return {
            "boost": dict(self._boost),
            "best": dict(self._best),
            "best_n": dict(self._best_n),
            "last": dict(self._last),
            "evals": self._evals,
            "events": list(self._events),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self._boost.update({n: float(v) for n, v in state["boost"].items() if n in self._boost})
        self._best = {n: float(v) for n, v in state["best"].items()}
        self._best_n = {n: int(v) for n, v in state.get("best_n", {}).items()}
        self._last = {n: float(v) for n, v in state["last"].items()}
        self._evals = int(state["evals"])
        self._events = [dict(e) for e in state["events"]]
