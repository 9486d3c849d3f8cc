"""The closed loop's rollout step through the pipeline: one step's tasks in, groups out.

Invariant: `sample` returns one group per task it ran, in task order (tasks
of a paused domain are skipped and counted, never generated), each group's
samples seeded by (run seed, step, group index) so results do not depend on
batching or on the runtime (embedded threads or Ray actors); replacement
rounds draw fresh tasks for groups dynamic sampling filtered, and count them.
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Mapping, Sequence

from posttrain.domains.base import stable_hash
from posttrain.pipeline.config import PipelineConfig, Runtime
from posttrain.pipeline.core import Pipeline
from posttrain.pipeline.scheduler import EventSink, Scheduler
from posttrain.pipeline.workers import EmbeddedWorkers, Workers
from posttrain.rollout import Rollout, informative
from posttrain.types import SamplingParams, Task


def make_workers(runtime: Runtime, config: PipelineConfig, engine: Any, ray_address: str | None = None) -> Workers:
    """Embedded: the engine in a thread, verification in threads or processes.
    Ray: generation, execution and verification actors on a Ray cluster."""
    if runtime == "ray":
        from posttrain.runtime.ray import RayWorkers

        return RayWorkers.from_engine(engine, config, address=ray_address)
    return EmbeddedWorkers(engine, verify_processes=config.verify_processes, execute_threads=config.execute_workers,
                           verify_threads=config.verify_workers)


def trace_events(trace: Any, log: Callable[[str], None]) -> EventSink:
    """An event sink that keeps each event in the trace's events table; alarms are also logged."""

    def sink(kind: str, message: str, domain: str | None, data: Mapping[str, Any]) -> None:
        trace.add_event(kind, message, step=data.get("step"), domain=domain, data=dict(data))
        if kind in ("alarm", "recovered"):
            log(f"{kind}: {message}")

    return sink


class StepRollouts:
    def __init__(self, config: PipelineConfig, workers: Workers, pool: Any, seed: int,
                 events: EventSink | None = None, dynamic_sampling: bool = True) -> None:
        self.config = config
        self.workers = workers
        self.pool = pool
        self.seed = seed
        self.dynamic_sampling = dynamic_sampling
        tiers = {n: pool.domains[n].cost_class for n in pool.names}
        self.scheduler = Scheduler(config, pool.target_shares(), tiers, events)
        self.totals: dict[str, int] = {"replaced": 0}
        self._events = events

    def sample(self, tasks: Sequence[Task], params: SamplingParams, step: int) -> tuple[list[list[Rollout]], dict[str, float]]:
        """Every group of the step (first round, then replacement rounds) and the pipeline's stats."""
        sync = getattr(self.workers, "sync", None)
        if callable(sync):
            sync()
        groups, stats = asyncio.run(self._sample(list(tasks), params, step))
        if self._events is not None:
            self._events("pipeline", f"rollout step {step}", None, {"step": step, **stats})
        return groups, stats

    async def _sample(self, tasks: list[Task], params: SamplingParams, step: int) -> tuple[list[list[Rollout]], dict[str, float]]:
        seed = stable_hash("rollout", self.seed, step)
        groups: list[list[Rollout]] = []
        replaced = 0
        async with Pipeline(self.config, self.workers, params, self.scheduler, group_prefix=f"{step}:", seed=seed) as pipe:
            for round_ in range(self.config.replace_rounds + 1):
                results = await pipe.run_groups(tasks)
                new = [list(r.rollouts) for r in results if r is not None]
                groups += new
                missing = sum(not informative(g) for g in new) if self.dynamic_sampling else 0
                if not missing or round_ == self.config.replace_rounds:
                    break
                tasks = self.pool.draw(missing)
                replaced += missing
            stats = pipe.stats().flat()
        self.totals["replaced"] += replaced
        stats["pipe_replaced"] = float(replaced)
        for name, row in self.scheduler.mix().items():
            stats[f"mix_{name}"] = round(row["realised"], 4)
        return groups, stats

    def mix(self) -> Mapping[str, Mapping[str, float]]:
        return self.scheduler.mix()

    def close(self) -> None:
        self.workers.close()
