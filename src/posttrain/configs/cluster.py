"""The cluster file of `posttrain plan RUN --cluster FILE`: the machine the planner predicts for.

Invariant: a ClusterConfig that validates can be simulated as is: every count is at least one,
every rate is positive and finite or `measured` (taken from the run's own trace), the search is
bounded (at most MAX_SPLITS worker splits), the simulation is bounded in events and wall time
(`simulate.max_events`, `simulate.deadline_s`), unknown keys are rejected, and `load_cluster`
turns any bad file into one ConfigError naming the file and each bad field. What validates here
may still be refused by the planner with one ConfigError (a loop shape that can never train a
step, a plan over its event budget or deadline: plan/__init__.py).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from posttrain.configs.section import did_you_mean, fields_at
from posttrain.errors import ConfigError

_STRICT = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
MAX_SPLITS = 4096
Measured = Literal["measured"]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
MAX_EVENTS = 20_000_000
"""The most simulated events `simulate.max_events` may allow (about 5 minutes of simulation)."""


class EnginesSpec(BaseModel):
    """The inference engines that generation calls run on."""

    model_config = _STRICT
    count: int = Field(1, ge=1, le=4096)
    """Engines; at most this many generation calls run at once, whatever the generate workers."""
    tokens_per_s: Positive | Measured = "measured"
    """Completion tokens one engine produces per second in a generation call ("measured": the
    run's own rate, its completion tokens over its generation calls' seconds)."""


class TrainerSpec(BaseModel):
    """The trainer: the cost of one optimiser step and what follows it."""

    model_config = _STRICT
    tokens_per_s: Positive | Measured = "measured"
    """Trained tokens per second ("measured": the run's, its steps' tokens over their seconds)."""
    step_overhead_s: NonNegative | Measured = "measured"
    """Seconds of each step outside sampling and the optimiser step: the weight push to the
    engines, the trace and metrics writes ("measured": the run's own, sampled step by step)."""


class WorkersSpec(BaseModel):
    """Concurrent workers of each rollout stage (as pipeline.*_workers)."""

    model_config = _STRICT
    generate: int = Field(1, ge=1, le=1024)
    """Generation workers (each one engine call at a time, batching queued groups)."""
    execute: int = Field(4, ge=1, le=4096)
    """Execution workers (each one group's programs at a time)."""
    verify: int = Field(2, ge=1, le=1024)
    """Verification workers (each one group at a time)."""


class SearchSpec(BaseModel):
    """The bounded search for the worker split with the most steps per hour."""

    model_config = _STRICT
    generate: list[int] = Field(default_factory=lambda: [1, 2, 4])
    """Generation worker counts to try."""
    execute: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16])
    """Execution worker counts to try."""
    verify: list[int] = Field(default_factory=lambda: [1, 2, 4])
    """Verification worker counts to try."""
    max_workers: int | None = Field(None, ge=3)
    """Most workers of the three stages together (None: no budget)."""

    @model_validator(mode="after")
    def _bounded(self) -> SearchSpec:
        for name in ("generate", "execute", "verify"):
            values = getattr(self, name)
            if not values or min(values) < 1:
                raise ValueError(f"search.{name} must list worker counts >= 1 (got {values})")
        n = len(self.generate) * len(self.execute) * len(self.verify)
        if n > MAX_SPLITS:
            raise ValueError(f"search tries {n} splits; at most {MAX_SPLITS}")
        if self.max_workers is not None and not any(sum(s) <= self.max_workers for s in self.splits()):
            raise ValueError(f"search.max_workers ({self.max_workers}) leaves no split to try")
        return self

    def splits(self) -> list[tuple[int, int, int]]:
        """Every (generate, execute, verify) tried, within the budget."""
        every = itertools.product(sorted(set(self.generate)), sorted(set(self.execute)), sorted(set(self.verify)))
        return [s for s in every if self.max_workers is None or sum(s) <= self.max_workers]


class ShapeSpec(BaseModel):
    """The loop's shape; each field left out is the run's own (its config.yaml)."""

    model_config = _STRICT
    mode: Literal["sync", "async"] | None = None
    """sync: a barrier per step (all its groups, then the step); async: streamed under max_staleness."""
    max_staleness: int | None = Field(None, ge=0, le=1_000_000)
    """mode async: weight versions a trained group may lag its admission."""
    prompts_per_step: int | None = Field(None, ge=1, le=1_000_000)
    """Groups trained per step."""
    queue_size: int | None = Field(None, ge=1, le=1_000_000)
    """Capacity of each queue between stages."""
    max_inflight: int | None = Field(None, ge=1, le=1_000_000)
    """Most groups admitted and not yet finished."""
    generate_batch: int | None = Field(None, ge=1, le=65536)
    """Most groups one generation call takes."""

    @model_validator(mode="after")
    def _sync_is_on_policy(self) -> ShapeSpec:
        if self.mode == "sync" and self.max_staleness:
            raise ValueError(f"pipeline.max_staleness ({self.max_staleness}) bounds mode async; sync is on-policy")
        return self


class SimulateSpec(BaseModel):
    """How long and how often the simulation runs."""

    model_config = _STRICT
    steps: int = Field(200, ge=1, le=100_000)
    """Train steps simulated per replica."""
    replicas: int = Field(4, ge=1, le=1000)
    """Independent replicas (seeds seed, seed+1, ...) whose steps per hour are averaged."""
    search_steps: int = Field(60, ge=1, le=100_000)
    """Train steps simulated per replica for each split of the search."""
    draw: Literal["bootstrap", "replay"] = "bootstrap"
    """bootstrap: each group drawn at random (the domain by its share, then one of its measured
    groups); replay: the run's groups in their admission order, cycled (the same task sequence
    the run saw: what a rerun with the same seed would face)."""
    max_events: int = Field(2_000_000, ge=1000, le=MAX_EVENTS)
    """Most simulated events (a group's generation, each of its programs, its verification, a
    step) over the whole plan, the search included, counted before simulating from the steps,
    replicas, splits, groups per step and group size: a plan over it is refused up front, and
    a simulation that reaches it stops. It bounds the planner's time and memory."""
    deadline_s: float = Field(30.0, gt=0, le=3600, allow_inf_nan=False)
    """Wall-clock seconds the whole plan may take; past it the plan stops with one error."""


class ClusterConfig(BaseModel):
    """A described cluster: engines, sandbox slots, trainer, workers per stage, the search."""

    model_config = _STRICT
    engines: EnginesSpec = EnginesSpec()
    """The inference engines."""
    sandbox_slots: int = Field(64, ge=1, le=1_000_000)
    """Sandbox programs that may run at once (as sandbox.workers); a group's programs share them."""
    trainer: TrainerSpec = TrainerSpec()
    """The trainer's throughput and per-step overhead."""
    workers: WorkersSpec = WorkersSpec()
    """The worker split to predict."""
    search: SearchSpec = SearchSpec()
    """The splits searched for the best one."""
    pipeline: ShapeSpec = ShapeSpec()
    """Overrides of the run's loop shape."""
    simulate: SimulateSpec = SimulateSpec()
    """Simulation length and replicas."""


def load_cluster(path: str | Path) -> ClusterConfig:
    """The cluster file at `path` (YAML or JSON), or one ConfigError naming the file and each bad field."""
    from posttrain.configs import read_yaml

    tree = read_yaml(path)
    try:
        return ClusterConfig.model_validate(tree)
    except ValidationError as exc:
        bad = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            what = "unknown field" if err["type"] == "extra_forbidden" else f"{err['msg']} (got {err.get('input')!r})"
            if err["type"] == "extra_forbidden":
                what += _near(ClusterConfig, err["loc"])
            bad.append(f"{loc}: {what}")
        raise ConfigError(f"cluster file {path}: " + "; ".join(bad)) from None


def _near(model: type[BaseModel], loc: tuple) -> str:
    """A did-you-mean for the unknown field at `loc` among its section's fields."""
    return did_you_mean(str(loc[-1]), fields_at(model, loc))
