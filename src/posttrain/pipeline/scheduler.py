"""The scheduler: which drawn task is admitted next, how many may be in flight, and which
domains are paused.

What a run does with it: the mix of domains is the task pool's (`TaskPool.draw`,
tasks/pool.py: smooth weighted round-robin by target share, within one round of it); the
pipeline's schedulers (pipeline/core.py, pipeline/play.py) admit the drawn tasks through
`next_admissible`, `admit` and `finish`, skip a paused domain's tasks (`is_paused`), and
report each verified group (`record_verification`).

Invariant: a task is admitted only when a slot of its tier is free and its domain is under
its quota (`admissible`): long tasks only ever occupy the `long_slots` reserved for them and
short tasks never do, so a long task cannot block a short one; a domain never has more
groups in flight than its quota (`tasks.domains.<name>.max_inflight`, else
`pipeline.domain_quota`; 0: none); among tasks waiting for admission, a higher priority
goes first (`priority`: the task's `meta.priority`, else its domain's), the first drawn on a
tie; a domain whose verifier failed `degrade_after` groups in a row is paused with an alarm
event, and gets one probe group per cooldown until a probe verifies.

`pick()` is not on a run's path: it chooses a domain by deficit (the domain furthest below
weight x admissions goes next, so over N admissions each unpaused domain's count is within
`mix_slack` + 1 of its target) for a caller that admits by domain rather than by drawn task.
No scheduler of the loop or the evaluator calls it (its tests do), so `pipeline.mix_slack`
changes no run today.

A new scheduler policy (what runs next and where) is a change here, where admission is
decided, never in a scheduler loop: docs/extending.md says what it may touch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.configs.pipeline import PipelineConfig
from posttrain.errors import ConfigError
from posttrain.types import CostClass, Task

EventSink = Callable[[str, str, "str | None", Mapping[str, Any]], None]
"""(kind, message, domain, data): the trace's add_event, or a logger."""


@dataclass
class _DomainState:
    weight: float
    tier: CostClass
    quota: int = 0
    priority: int = 0
    admitted: int = 0
    inflight: int = 0
    finished: int = 0
    fail_streak: int = 0
    paused_until: float | None = None
    probing: bool = False
    alarms: int = 0


class AdaptiveCap:
    """The in-flight cap, driven by queue depth: it shrinks by one while the
    fullest downstream queue is over `high` full and grows by one while it is
    under `low` full, between the floor and the ceiling."""

    def __init__(self, floor: int, ceiling: int, high: float = 0.75, low: float = 0.25) -> None:
        self.floor, self.ceiling, self.high, self.low = floor, ceiling, high, low
        self.value = ceiling
        self.shrinks = self.grows = 0

    def update(self, fill: float) -> int:
        if fill > self.high and self.value > self.floor:
            self.value -= 1
            self.shrinks += 1
        elif fill < self.low and self.value < self.ceiling:
            self.value += 1
            self.grows += 1
        return self.value


class Scheduler:
    def __init__(
        self,
        config: PipelineConfig,
        weights: Mapping[str, float],
        tiers: Mapping[str, CostClass],
        events: EventSink | None = None,
        clock: Callable[[], float] = time.monotonic,
        quotas: Mapping[str, int | None] | None = None,
        priorities: Mapping[str, int] | None = None,
    ) -> None:
        """`quotas`: per-domain most in-flight groups (None or absent: `config.domain_quota`);
        `priorities`: per-domain admission priority (absent: 0)."""
        if not weights:
            raise ConfigError("scheduler: weights is empty: give at least one domain a weight")
        bad = {n: w for n, w in weights.items() if not w > 0}
        if bad:
            raise ConfigError(f"scheduler: weights must be > 0, got {bad}")
        missing = sorted(set(weights) - set(tiers))
        if missing:
            raise ConfigError(f"scheduler: no cost class (tier) for domains {missing}")
        self.config = config
        quotas, priorities = quotas or {}, priorities or {}
        self.domains = {
            n: _DomainState(float(w), tiers[n], quotas.get(n) or config.domain_quota, int(priorities.get(n, 0)))
            for n, w in sorted(weights.items())
        }
        self.cap = AdaptiveCap(config.min_inflight, config.max_inflight)
        self._events: EventSink = events or (lambda *_: None)
        self._clock = clock
        self._admitted = 0
        self.inflight = {"short": 0, "long": 0}

    # ---- slots ---------------------------------------------------------
    def tier(self, name: str) -> CostClass:
        """The slot class a domain's groups take (long only when long slots exist)."""
        tier = self.domains[name].tier
        return "long" if tier == "long" and self.config.long_slots > 0 else "short"

    def slot_free(self, tier: CostClass) -> bool:
        if tier == "long":
            return self.inflight["long"] < self.config.long_slots
        return self.inflight["short"] < max(1, self.cap.value - self.config.long_slots)

    def quota_free(self, name: str) -> bool:
        """Whether another group of `name` fits under its in-flight quota."""
        d = self.domains[name]
        return not (d.quota and d.inflight >= d.quota)

    def admissible(self, task: Task) -> bool:
        """Whether `task` may be admitted now: a free slot of its tier and room in its domain's quota."""
        return self.slot_free(self.tier(task.domain)) and self.quota_free(task.domain)

    def priority(self, task: Task) -> int:
        """`task`'s admission priority: its own (`meta.priority`), else its domain's."""
        own = task.meta.priority
        return self.domains[task.domain].priority if own is None else own

    def next_admissible(self, tasks: Sequence[Task]) -> int | None:
        """The index in `tasks` (pending, in their order) of the one to admit next: the highest
        priority among the admissible ones, the first of them on a tie; None when none is admissible."""
        best: int | None = None
        for i, task in enumerate(tasks):
            if self.admissible(task) and (best is None or self.priority(task) > self.priority(tasks[best])):
                best = i
        return best

    # ---- the mix -------------------------------------------------------
    def target_shares(self) -> dict[str, float]:
        total = sum(d.weight for d in self.domains.values())
        return {n: d.weight / total for n, d in self.domains.items()}

    def _deficit(self, name: str, shares: Mapping[str, float]) -> float:
        return shares[name] * (self._admitted + 1) - self.domains[name].admitted

    def _available(self, name: str) -> bool:
        d = self.domains[name]
        if d.paused_until is not None and (d.probing or self._clock() < d.paused_until):
            return False
        return self.quota_free(name)

    def pick(self) -> str | None:
        """The domain to admit next, or None when admission must wait."""
        shares = self.target_shares()
        live = [n for n in self.domains if self._available(n)]
        if not live:
            return None
        ranked = sorted(live, key=lambda n: (-self._deficit(n, shares), n))
        leader = ranked[0]
        if self.slot_free(self.tier(leader)):
            return leader
        if self._deficit(leader, shares) > self.config.mix_slack:
            return None  # wait for the lagging domain rather than drift from the mix
        return next((n for n in ranked[1:] if self.slot_free(self.tier(n))), None)

    def admit(self, name: str) -> CostClass:
        d = self.domains[name]
        if d.paused_until is not None:
            d.probing = True
        d.admitted += 1
        d.inflight += 1
        self._admitted += 1
        tier = self.tier(name)
        self.inflight[tier] += 1
        return tier

    def finish(self, name: str) -> None:
        d = self.domains[name]
        d.inflight -= 1
        d.finished += 1
        self.inflight[self.tier(name)] -= 1

    # ---- degradation ---------------------------------------------------
    def is_paused(self, name: str) -> bool:
        return not self._available(name) and self.domains[name].paused_until is not None

    def record_verification(self, name: str, failed: bool) -> None:
        """One group verified: `failed` when its verifier raised (an infra error)."""
        d = self.domains[name]
        if not failed:
            if d.paused_until is not None:
                self._events("recovered", f"domain {name} verifies again; unpaused", name, {"alarms": d.alarms})
            d.fail_streak, d.paused_until, d.probing = 0, None, False
            return
        d.fail_streak += 1
        if d.probing or (d.paused_until is None and d.fail_streak >= self.config.degrade_after):
            d.paused_until = self._clock() + self.config.degrade_cooldown_s
            d.probing = False
            d.alarms += 1
            self._events(
                "alarm",
                f"domain {name} paused: its verifier failed {d.fail_streak} groups in a row",
                name,
                {"fail_streak": d.fail_streak, "cooldown_s": self.config.degrade_cooldown_s},
            )

    # ---- reporting -----------------------------------------------------
    def mix(self) -> dict[str, dict[str, float]]:
        """Per domain: target share, realised share of admissions, admitted, finished, paused."""
        shares = self.target_shares()
        total = max(1, self._admitted)
        return {
            n: {
                "target": shares[n],
                "realised": d.admitted / total,
                "admitted": d.admitted,
                "finished": d.finished,
                "paused": float(d.paused_until is not None),
                "alarms": d.alarms,
            }
            for n, d in self.domains.items()
        }
