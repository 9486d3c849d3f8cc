"""Elastic stage pools: the controller that decides how many actors each stage holds.

Invariant: a decision never leaves a stage's bounds (`pipeline.elastic.<stage>`), changes a
stage by one actor at a time, and only after its condition held for `hold_periods`
consecutive looks and `cooldown_s` passed since that stage's last change (hysteresis);
the controller only decides: the pool (pipeline/ray.py) applies a change, and removes an
actor only once it has no call in flight (drain first). It reads no clock of its own: the
caller passes `now`, so its decisions are a function of the loads and times it is shown.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from posttrain.configs.pipeline import STAGES, ElasticConfig


@dataclass(frozen=True)
class StageLoad:
    """What one stage's pool looked like over the last period."""

    workers: int
    """Actors the pool holds now (draining ones not counted)."""
    waiting: float
    """Calls waiting for a busy actor (the stage's backlog at the actors), on average over the period."""
    idle_share: float
    """Share of the actors' time over the period with no call in flight (0..1)."""


@dataclass(frozen=True)
class Change:
    """One pool change: `stage` went from `before` to `after` actors at time `at`."""

    at: float
    stage: str
    before: int
    after: int
    reason: str


@dataclass
class _Streak:
    grow: int = 0
    shrink: int = 0
    changed_at: float | None = None


@dataclass
class ElasticController:
    """Per look (`decide`), the target actor count of each stage (module docstring)."""

    config: ElasticConfig
    streaks: dict[str, _Streak] = field(default_factory=lambda: {s: _Streak() for s in STAGES})

    def decide(self, now: float, loads: Mapping[str, StageLoad]) -> list[Change]:
        """The changes to make now, one per stage at most (shrinks first: what a shrink frees
        may let a grow of another stage fit)."""
        out: list[Change] = []
        for stage, load in loads.items():
            b, st = self.config.bounds(stage), self.streaks[stage]
            n = load.workers
            if n < b.min or n > b.max:  # outside the bounds (an actor lost for good): back inside at once
                target = min(max(n, b.min), b.max)
                out.append(Change(now, stage, n, target, "bounds"))
                st.grow = st.shrink = 0
                st.changed_at = now
                continue
            grow = load.waiting / max(n, 1) >= self.config.grow_backlog
            shrink = not grow and load.idle_share >= self.config.shrink_idle
            st.grow = st.grow + 1 if grow else 0
            st.shrink = st.shrink + 1 if shrink else 0
            cooled = st.changed_at is None or now - st.changed_at >= self.config.cooldown_s
            if not cooled:
                continue
            if st.grow >= self.config.hold_periods and n < b.max:
                out.append(Change(now, stage, n, n + 1, f"backlog {load.waiting:g} on {n}"))
            elif st.shrink >= self.config.hold_periods and n > b.min:
                out.append(Change(now, stage, n, n - 1, f"idle {load.idle_share:.0%}"))
            else:
                continue
            st.grow = st.shrink = 0
            st.changed_at = now
        return sorted(out, key=lambda c: c.after > c.before)

    def undo(self, change: Change) -> None:
        """`change` could not be applied (the cluster had no room for another actor): that
        stage may try again at its next look that meets the condition, not after a cooldown."""
        self.streaks[change.stage].changed_at = None
