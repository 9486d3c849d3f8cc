"""Capacity planning from a finished run: `posttrain plan RUN --cluster FILE`.

Invariant: a plan is the run's own empirical costs (`profile.py`) replayed through the
pipeline's model (`sim.py`) on the described cluster (`configs/cluster.py`): nothing is
predicted that the trace and metrics did not measure or the cluster file did not state. The
search tries every split of `search` (bounded) and keeps the one with the most steps per hour
(any within TIE of the most count as tied: the one with the fewest workers wins).
`output.py` writes the table, the JSON and the plot.

Bounds: every valid cluster file either plans within `simulate.max_events` simulated events and
`simulate.deadline_s` seconds, or gets one ConfigError (one line, exit code 2 from the CLI),
never a traceback or a hang. Refused before simulating: a loop shape that can never train a
step (async with fewer admissible groups than a step trains) and a plan whose event count
(`events_bound`) exceeds the budget; refused while simulating: a simulation that reaches the
budget or the deadline, stalls, or whose time is zero or overflows (sim.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.configs.cluster import ClusterConfig, load_cluster
from posttrain.errors import ConfigError
from posttrain.plan.profile import Profile, load_profile
from posttrain.plan.sim import Costs, Shape, SimResult, Simulation

TIE = 0.01
"""Splits within this share of the best steps per hour are a tie (the fewest workers wins)."""
__all__ = [
    "Bounds",
    "Plan",
    "Prediction",
    "events_bound",
    "load_cluster",
    "pick_best",
    "plan_profile",
    "plan_run",
    "predict",
]


@dataclass
class Bounds:
    """What the whole plan may still spend: simulated events and a monotonic-clock deadline."""

    max_events: int
    deadline: float
    used: int = 0


@dataclass(frozen=True)
class Prediction:
    """One worker split's predicted throughput, averaged over replicas."""

    workers: tuple[int, int, int]
    steps_per_hour: float
    utilisation: dict[str, float]
    bottleneck: str
    step_s_mean: float

    def as_dict(self) -> dict[str, Any]:
        g, e, v = self.workers
        return {
            "workers": {"generate": g, "execute": e, "verify": v},
            "steps_per_hour": self.steps_per_hour,
            "utilisation": self.utilisation,
            "bottleneck": self.bottleneck,
            "step_s_mean": self.step_s_mean,
        }


@dataclass(frozen=True)
class Plan:
    run: str
    cluster: ClusterConfig
    profile: Profile
    costs: Costs
    shape: Shape
    current: Prediction
    best: Prediction
    searched: tuple[Prediction, ...]
    events: int = 0
    """Simulated events the plan spent (at most the cluster file's simulate.max_events)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "cluster": self.cluster.model_dump(mode="json"),
            "measured": {
                "groups": len(self.profile.groups),
                "generation_calls": self.profile.calls,
                "engine_tokens_per_s": self.profile.tokens_per_s,
                "train_s_per_token": self.profile.train_s_per_token,
                "step_overhead_s_mean": sum(self.profile.overhead_s) / max(1, len(self.profile.overhead_s)),
                "domains": self.profile.summary(),
            },
            "shape": {
                "mode": self.shape.mode,
                "max_staleness": self.shape.max_staleness,
                "prompts_per_step": self.shape.prompts_per_step,
            },
            "current": self.current.as_dict(),
            "best": self.best.as_dict(),
            "searched": [p.as_dict() for p in self.searched],
        }


def costs_for(profile: Profile, cluster: ClusterConfig) -> Costs:
    """The cluster's costs: its stated rates, or the run's measured ones where it says `measured`."""
    rate = profile.tokens_per_s if cluster.engines.tokens_per_s == "measured" else cluster.engines.tokens_per_s
    t = cluster.trainer
    per_token = profile.train_s_per_token if t.tokens_per_s == "measured" else 1.0 / t.tokens_per_s
    overhead = profile.overhead_s if t.step_overhead_s == "measured" else [t.step_overhead_s]
    return Costs(
        tokens_per_s=float(rate),
        engines=cluster.engines.count,
        train_s_per_token=per_token,
        train_tokens=profile.train_tokens,
        overhead_s=overhead or [0.0],
        sandbox_slots=cluster.sandbox_slots,
        group_size=profile.shape.group_size,
    )


def shape_for(profile: Profile, cluster: ClusterConfig, workers: tuple[int, int, int]) -> Shape:
    """The loop shape: the run's, with the cluster file's `pipeline` overrides."""
    run, over = profile.shape, cluster.pipeline
    mode = over.mode or run.mode
    staleness = over.max_staleness if over.max_staleness is not None else (run.max_staleness if mode == run.mode else 0)
    p = over.prompts_per_step or run.prompts_per_step
    return Shape(
        mode=mode,
        max_staleness=0 if mode == "sync" else staleness,
        prompts_per_step=p,
        queue_size=over.queue_size or run.queue_size,
        max_inflight=over.max_inflight or run.max_inflight,
        generate_batch=over.generate_batch or run.generate_batch,
        workers=workers,
        tokens_scale=p / run.prompts_per_step,
    )


def predict(
    profile: Profile,
    costs: Costs,
    shape: Shape,
    steps: int,
    replicas: int,
    seed: int,
    replay: bool = False,
    bounds: Bounds | None = None,
) -> Prediction:
    """The split's mean over `replicas` seeded simulations of `steps` steps (`replay`: the run's
    groups in order rather than drawn), spending from `bounds` (None: unbounded)."""
    shares = {d: len(gs) / len(profile.groups) for d, gs in profile.by_domain.items()}
    order = profile.groups if replay else None
    results: list[SimResult] = []
    for r in range(replicas):
        sim = Simulation(profile.by_domain, shares, costs, shape, seed + r, order)
        if bounds is None:
            results.append(sim.run(steps))
            continue
        results.append(sim.run(steps, bounds.max_events - bounds.used, bounds.deadline))
        bounds.used += results[-1].events
    util = {k: sum(r.utilisation[k] for r in results) / replicas for k in results[0].utilisation}
    sph = sum(r.steps_per_hour for r in results) / replicas
    step_s = sum(r.wall_s for r in results) / (replicas * steps)
    return Prediction(shape.workers, sph, util, max(util, key=lambda k: util[k]), step_s)


def check_shape(shape: Shape) -> None:
    """Refuse a loop shape under which no step can ever train (one ConfigError)."""
    if shape.mode != "async":
        return
    bound = min(shape.max_inflight, (shape.max_staleness + 1) * shape.prompts_per_step)
    if bound < shape.prompts_per_step:
        raise ConfigError(
            f"mode async admits at most {bound} untrained groups (pipeline.max_inflight {shape.max_inflight}, the "
            f"cluster file's or the run's), fewer than a step trains (pipeline.prompts_per_step "
            f"{shape.prompts_per_step}): no step could ever train; set pipeline.max_inflight >= "
            f"{shape.prompts_per_step}"
        )


def events_bound(cluster: ClusterConfig, shape: Shape, group_size: int) -> int:
    """The most events the plan can simulate: per simulated step, each group's generation, its
    `group_size` programs, its execution's end and its verification, plus the step's admission and
    training; async counts the (max_staleness + 1) steps of groups in flight past the last step."""
    sim = cluster.simulate
    per_step = shape.prompts_per_step * (group_size + 3) + 2
    extra = shape.max_staleness + 1 if shape.mode == "async" else 0
    runs = [(sim.steps, 1), (sim.search_steps, len(cluster.search.splits()))]
    return sum((steps + extra) * per_step * sim.replicas * n for steps, n in runs)


def plan_profile(profile: Profile, cluster: ClusterConfig, run: str = "", seed: int = 0) -> Plan:
    """Predict the cluster's own split and search its splits, from `profile`, within the cluster
    file's bounds (`simulate.max_events`, `simulate.deadline_s`) or one ConfigError."""
    costs = costs_for(profile, cluster)
    sim = cluster.simulate
    w = cluster.workers
    current_shape = shape_for(profile, cluster, (w.generate, w.execute, w.verify))
    check_shape(current_shape)
    need = events_bound(cluster, current_shape, costs.group_size)
    if need > sim.max_events:
        raise ConfigError(
            f"the plan could simulate {need:,} events, over simulate.max_events ({sim.max_events:,}): lower "
            "simulate.steps, replicas or search_steps, the search's splits, or pipeline.prompts_per_step"
        )
    bounds = Bounds(sim.max_events, time.monotonic() + sim.deadline_s)
    replay = sim.draw == "replay"
    current = predict(profile, costs, current_shape, sim.steps, sim.replicas, seed, replay, bounds)
    searched = tuple(
        predict(
            profile, costs, shape_for(profile, cluster, split), sim.search_steps, sim.replicas, seed, replay, bounds
        )
        for split in cluster.search.splits()
    )
    best = pick_best(current, searched)
    return Plan(run, cluster, profile, costs, current_shape, current, best, searched, bounds.used)


def plan_run(run_dir: str | Path, cluster: ClusterConfig, seed: int = 0) -> Plan:
    """The plan for `cluster` from the finished run in `run_dir`."""
    return plan_profile(load_profile(run_dir), cluster, str(run_dir), seed)


def pick_best(current: Prediction, searched: tuple[Prediction, ...]) -> Prediction:
    """The fewest workers among the splits within TIE of the fastest, never slower than the
    cluster's own split: that split is a candidate too (the search may not hold it, and its
    prediction runs `simulate.steps`, the search's `search_steps`)."""
    candidates = (*searched, current)
    top = max(p.steps_per_hour for p in candidates)
    near = [p for p in candidates if p.steps_per_hour >= (1 - TIE) * top and p.steps_per_hour >= current.steps_per_hour]
    return min(near, key=lambda p: (sum(p.workers), -p.steps_per_hour))
