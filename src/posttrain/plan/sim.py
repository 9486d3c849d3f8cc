"""A discrete-event model of the rollout pipeline and trainer, replaying a run's empirical groups.

Invariant: simulated time moves only by the durations of sampled work, so one seed gives one
result. The model is the pipeline's own shape (pipeline/core.py): groups are drawn at random by
domain share (or replayed in the run's order, `order`); admission puts groups in the generate
queue; generate workers (at most one engine call each, at most `engines` at once) take up to
`generate_batch` queued groups per call, lasting the batch's completion tokens over the
engine's rate; execute workers take one group each (groups with no execution skip the stage)
and hand its `group_size` programs, each lasting the group's `program_s`, to one pool of
min(execute workers, sandbox slots) program slots shared by all groups (as the pipeline runs
programs on a pool of `execute_workers` threads, pipeline/step.py), FIFO; the group leaves when
its last program ends. Verify workers take one group each. Every queue holds at most
`queue_size` groups: a worker whose next queue is full holds its groups (blocked, not busy)
until there is room. mode sync: a step admits its `prompts_per_step` groups together and
trains when all are finished (the barrier); async: groups stream in while fewer than
min(max_inflight, (max_staleness + 1) x prompts_per_step) are admitted and untrained, and the
trainer takes the first `prompts_per_step` finished. A step costs its trained tokens times
seconds per token plus a sampled step overhead (the weight push, the writes). What it does not
model: generation time that is not linear in a call's tokens, engine preemption, retries, and
dynamic sampling's replacement groups.

Bounds: `run` stops with one ConfigError, never a hang, when it has handled `max_events`
events, when the monotonic clock passes `deadline` (checked every CHECK_EVERY events), when no
event is left before the last step (a stall: the shape can never train a step), or when the
simulated time is zero or not finite (every cost zero, or a rate so small that time overflows).
"""

from __future__ import annotations

import functools
import heapq
import math
import random
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from posttrain.errors import ConfigError
from posttrain.plan.profile import GroupSample

STAGES = ("generate", "execute", "verify")
CHECK_EVERY = 4096
"""Events between two looks at the wall clock."""


@dataclass(frozen=True)
class Costs:
    """What each unit of work costs on the described cluster."""

    tokens_per_s: float
    """Completion tokens per second of one engine."""
    engines: int
    train_s_per_token: float
    train_tokens: Sequence[int]
    """Trained tokens per step, sampled (scaled by prompts_per_step over the run's)."""
    overhead_s: Sequence[float]
    """Seconds per step outside sampling and the optimiser step, sampled."""
    sandbox_slots: int
    group_size: int


@dataclass(frozen=True)
class Shape:
    """The loop's shape and the worker split."""

    mode: str
    max_staleness: int
    prompts_per_step: int
    queue_size: int
    max_inflight: int
    generate_batch: int
    workers: tuple[int, int, int]
    tokens_scale: float = 1.0
    """prompts_per_step over the run's: trained tokens per step scale by it."""


@dataclass
class Group:
    sample: GroupSample
    admitted: float
    finished: float = 0.0


@dataclass(frozen=True)
class StepRecord:
    start: float
    end: float
    latencies: tuple[float, ...]
    """Admission to finish of each group the step trained."""


@dataclass(frozen=True)
class SimResult:
    steps_per_hour: float
    wall_s: float
    utilisation: dict[str, float]
    """Busy share of each stage's concurrency (execute: of its program slots) and of the trainer."""
    bottleneck: str
    steps: tuple[StepRecord, ...]
    events: int = 0
    """Events the simulation handled."""


@dataclass
class _Stage:
    name: str
    limit: int
    batch: int
    duration: Callable[[list[Group]], float]
    queue: deque[Group] = field(default_factory=deque)
    busy: int = 0
    busy_s: float = 0.0
    waiting: deque[tuple[_Stage | None, list[Group]]] = field(default_factory=deque)
    """Upstream workers holding groups for this stage's full queue."""


class Simulation:
    """One replica: `run(steps)` simulates that many train steps."""

    def __init__(
        self,
        groups: Mapping[str, Sequence[GroupSample]],
        shares: Mapping[str, float],
        costs: Costs,
        shape: Shape,
        seed: int = 0,
        order: Sequence[GroupSample] | None = None,
    ) -> None:
        if not groups or any(not gs for gs in groups.values()):
            raise ValueError("the simulation needs at least one group sample per domain")
        self.groups, self.costs, self.shape = groups, costs, shape
        self.domains = sorted(groups)
        self.weights = [shares[d] for d in self.domains]
        self.rng = random.Random(seed)
        self.order, self.drawn = order, 0
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        g, e, v = shape.workers
        self.slots = min(e, costs.sandbox_slots)
        self.programs: deque[tuple[Group, list[Group]]] = deque()  # (group, its batch), one per program
        self.slots_busy = 0
        self.left: dict[int, int] = {}  # programs not yet ended, by id of the group's batch list
        self.stages = {
            "generate": _Stage("generate", min(g, costs.engines), shape.generate_batch, self._gen_time),
            "execute": _Stage("execute", e, 1, lambda b: 0.0),
            "verify": _Stage("verify", v, 1, lambda b: b[0].sample.verify_s),
        }
        self.finished: deque[Group] = deque()
        self.outstanding = 0  # admitted and not yet trained
        self.training = False
        self.train_busy = 0.0
        self.step_start = 0.0
        self.records: list[StepRecord] = []

    # -- the event loop
    def _at(self, delay: float, fn: Callable[[], None]) -> None:
        self._seq += 1
        heapq.heappush(self._events, (self.now + delay, self._seq, fn))

    def run(self, steps: int, max_events: int | None = None, deadline: float | None = None) -> SimResult:
        """Simulate `steps` train steps; at most `max_events` events, until `deadline` (monotonic)."""
        self.target = steps
        self._admit()
        handled = 0
        while self._events and len(self.records) < steps:
            if max_events is not None and handled >= max_events:
                raise ConfigError(
                    f"the plan reached its bound of simulated events (simulate.max_events) at step "
                    f"{len(self.records)} of {steps}"
                )
            if deadline is not None and handled % CHECK_EVERY == 0 and time.monotonic() > deadline:
                raise ConfigError(
                    f"the plan passed its deadline (simulate.deadline_s) at step {len(self.records)} "
                    f"of {steps}: lower simulate.steps, replicas or search_steps, or the search"
                )
            self.now, _, fn = heapq.heappop(self._events)
            fn()
            handled += 1
        if len(self.records) < steps:
            raise ConfigError(
                f"the simulation stalled after {len(self.records)} of {steps} steps: "
                f"no work is left that could finish a step of {self.shape.prompts_per_step} groups"
            )
        wall = self.records[-1].end
        if not math.isfinite(wall) or wall <= 0 or not math.isfinite(3600 * steps / wall):
            raise ConfigError(
                f"the simulated steps last {wall} s: every cost is zero (or next to it), or the costs overflow "
                "(a rate too small or an overhead too large: engines.tokens_per_s, trainer.*, the run's measured costs)"
            )
        util = {n: s.busy_s / (s.limit * wall) for n, s in self.stages.items()}
        util["execute"] = self.stages["execute"].busy_s / (self.slots * wall)  # busy share of the program slots
        util["trainer"] = self.train_busy / wall
        if not all(math.isfinite(u) for u in util.values()):
            raise ConfigError(f"a stage's simulated busy time overflows ({util}): a stated rate is too small")
        bottleneck = max(util, key=lambda n: util[n])
        return SimResult(3600 * steps / wall, wall, util, bottleneck, tuple(self.records), handled)

    # -- work
    def _draw(self) -> GroupSample:
        if self.order:
            self.drawn += 1
            return self.order[(self.drawn - 1) % len(self.order)]
        domain = self.rng.choices(self.domains, self.weights)[0]
        return self.rng.choice(self.groups[domain])

    def _gen_time(self, batch: list[Group]) -> float:
        return sum(g.sample.tokens for g in batch) / self.costs.tokens_per_s

    def _admit(self) -> None:
        gen = self.stages["generate"]
        if self.shape.mode == "sync":
            if self.outstanding == 0 and not self.training:
                self.step_start = self.now
                for _ in range(self.shape.prompts_per_step):
                    gen.queue.append(Group(self._draw(), self.now))
                self.outstanding = self.shape.prompts_per_step
        else:
            bound = min(self.shape.max_inflight, (self.shape.max_staleness + 1) * self.shape.prompts_per_step)
            while self.outstanding < bound and len(gen.queue) < self.shape.queue_size:
                gen.queue.append(Group(self._draw(), self.now))
                self.outstanding += 1
        self._start(gen)

    def _start(self, stage: _Stage) -> None:
        while stage.busy < stage.limit and stage.queue:
            batch = [stage.queue.popleft() for _ in range(min(stage.batch, len(stage.queue)))]
            stage.busy += 1
            if stage.name == "execute":
                self._run_programs(batch)
                continue
            took = stage.duration(batch)
            stage.busy_s += took
            self._at(took, functools.partial(self._done, stage, batch))
        while stage.waiting and len(stage.queue) < self.shape.queue_size:  # room again: release upstream
            up, held = stage.waiting.popleft()
            stage.queue.extend(held)
            if up is not None:
                up.busy -= 1
                self._start(up)
            self._start(stage)
        if stage.name == "generate" and self.shape.mode == "async":
            self._admit_later()

    def _run_programs(self, batch: list[Group]) -> None:
        """Queue the group's programs for the shared slots; the group is done with its last."""
        self.left[id(batch)] = self.costs.group_size
        self.programs.extend((batch[0], batch) for _ in range(self.costs.group_size))
        self._next_program()

    def _next_program(self) -> None:
        while self.slots_busy < self.slots and self.programs:
            group, batch = self.programs.popleft()
            self.slots_busy += 1
            took = group.sample.program_s
            self.stages["execute"].busy_s += took
            self._at(took, functools.partial(self._program_done, batch))

    def _program_done(self, batch: list[Group]) -> None:
        self.slots_busy -= 1
        self.left[id(batch)] -= 1
        if not self.left[id(batch)]:
            del self.left[id(batch)]
            self._done(self.stages["execute"], batch)
        self._next_program()

    def _admit_later(self) -> None:
        gen = self.stages["generate"]
        bound = min(self.shape.max_inflight, (self.shape.max_staleness + 1) * self.shape.prompts_per_step)
        if self.outstanding < bound and len(gen.queue) < self.shape.queue_size:
            self._at(0.0, self._admit)

    def _next(self, stage: _Stage, group: Group) -> _Stage | None:
        if stage.name == "generate" and group.sample.execute_s > 0:
            return self.stages["execute"]
        return self.stages["verify"] if stage.name != "verify" else None

    def _done(self, stage: _Stage, batch: list[Group]) -> None:
        release = True  # the worker is free unless a group waits for room (the first one frees it)
        for group in batch:
            nxt = self._next(stage, group)
            if nxt is None:
                group.finished = self.now
                self.finished.append(group)
            elif len(nxt.queue) < self.shape.queue_size:
                nxt.queue.append(group)
                self._start(nxt)
            else:  # full: this worker holds the group until the queue has room
                nxt.waiting.append((stage if release else None, [group]))
                release = False
        if release:
            stage.busy -= 1
        self._start(stage)
        self._train()

    def _train(self) -> None:
        p = self.shape.prompts_per_step
        if self.training or len(self.finished) < p or len(self.records) >= self.target:
            return
        batch = [self.finished.popleft() for _ in range(p)]
        tokens = self.rng.choice(self.costs.train_tokens) * self.shape.tokens_scale
        took = tokens * self.costs.train_s_per_token + self.rng.choice(self.costs.overhead_s)
        self.training = True
        self.train_busy += took
        start = self.step_start if self.shape.mode == "sync" else (self.records[-1].end if self.records else 0.0)

        def trained() -> None:
            self.training = False
            self.outstanding -= p
            self.records.append(StepRecord(start, self.now, tuple(g.finished - g.admitted for g in batch)))
            self._admit()
            self._train()

        self._at(took, trained)
