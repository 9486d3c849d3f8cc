"""The closed loop's rollout step through the pipeline: one step's tasks in, groups out.

Invariant: `sample` returns one group per task it ran, in task order (tasks of a paused domain
are skipped and counted, never generated), each group's samples seeded by (run seed, step, group
index) so results do not depend on batching, on the runtime (embedded threads or Ray actors) or
on the path (the direct path, pipeline/play.py, when every domain allows it; else the staged
pipeline on one event loop kept for the run); replacement rounds draw fresh tasks for groups
dynamic sampling filtered, and count them. Every task it is given or draws is registered in
`ledger` (pipeline/draws.py) when drawn, bound to its group, or dropped there when it never
becomes a returned group (a paused domain); the loop decides the returned groups' fates. This
is pipeline.mode sync; mode async streams through pipeline/continuous.py instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from posttrain.configs.pipeline import PipelineConfig, Runtime
from posttrain.contracts.engine import Engine
from posttrain.domains.base import Budget, stable_hash
from posttrain.errors import ConfigError
from posttrain.pipeline.core import GroupResult, Pipeline
from posttrain.pipeline.draws import DrawLedger
from posttrain.pipeline.play import Play
from posttrain.pipeline.scheduler import EventSink, Scheduler
from posttrain.pipeline.workers import DomainExecute, EmbeddedWorkers, ExecuteFn, Workers
from posttrain.rollout import Rollout, informative
from posttrain.types import SamplingParams, Task


def make_workers(
    runtime: Runtime,
    config: PipelineConfig,
    engine: Engine,
    ray_address: str | None = None,
    execute: ExecuteFn | None = None,
) -> Workers:
    """Embedded: the engine in a thread, execution and verification in threads (or
    verification in processes). Ray: generation, execution and verification actors
    on a Ray cluster. `execute` (default: each domain's declared execute step on the
    process-wide sandbox pool) is what the execute stage runs."""
    execute = execute or DomainExecute()
    if runtime == "ray":
        from posttrain.pipeline.ray import RayWorkers

        return RayWorkers.from_engine(engine, config, address=ray_address, execute=execute)
    source = None
    # generation overlaps training: an in-process engine (Engine.in_process, the hf engine) generates on its own
    # copy of the weights; a remote one (openai, vllm) generates in another process and gets new weights by push
    if config.mode == "async" and engine.in_process:
        source, engine = engine, detached_copy(engine)
    return EmbeddedWorkers(
        engine,
        execute,
        verify_processes=config.verify_processes,
        execute_threads=config.execute_workers,
        verify_threads=config.verify_workers,
        source=source,
    )


def detached_copy(engine: Any) -> Any:
    """An HF engine on a deep copy of `engine`'s model (same tokenizer, same version)."""
    import copy

    from posttrain.engine.hf import HFEngine

    if not isinstance(engine, HFEngine):
        raise ConfigError("pipeline.mode async in the embedded runtime copies an in-process hf engine only")
    config = engine.config.model_copy(update={"generate_dtype": "model"})  # engine.model is any copy already
    twin = HFEngine(copy.deepcopy(engine.model), engine.tokenizer, config=config, seed=0)
    twin.version = engine.version
    return twin


def trace_events(trace: Any, log: Callable[[str], None]) -> EventSink:
    """An event sink that keeps each event in the trace's events table; alarms are also logged."""

    def sink(kind: str, message: str, domain: str | None, data: Mapping[str, Any]) -> None:
        trace.add_event(kind, message, step=data.get("step"), domain=domain, data=dict(data))
        if kind in ("alarm", "recovered"):
            log(f"{kind}: {message}")

    return sink


def make_scheduler(config: PipelineConfig, pool: Any, events: EventSink | None = None) -> Scheduler:
    """The run's scheduler: the pool's target shares and cost tiers, each domain's quota and
    priority (tasks.domains.<name>); it lives across steps (its degradation state too)."""
    specs = pool.specs
    return Scheduler(
        config,
        pool.target_shares(),
        {n: pool.domains[n].cost_class for n in pool.names},
        events,
        quotas={n: s.max_inflight for n, s in specs.items()},
        priorities={n: s.priority for n, s in specs.items()},
    )


class StepRollouts:
    def __init__(
        self,
        config: PipelineConfig,
        workers: Workers,
        pool: Any,
        seed: int,
        events: EventSink | None = None,
        dynamic_sampling: bool = True,
        budgets: Mapping[str, Budget] | None = None,
    ) -> None:
        self.config = config
        self.budgets = budgets
        """Per-domain budgets (tokens per turn, turns); None: the sampling params' max_tokens for all."""
        self.workers = workers
        self.pool = pool
        self.seed = seed
        self.dynamic_sampling = dynamic_sampling
        self.scheduler = make_scheduler(config, pool, events)
        self._events = events
        self.direct = bool(
            config.direct and config.generate_timeout_s is None and all(workers.inline(n) for n in pool.names)
        )
        """Every step runs inline (pipeline/play.py, no asyncio stages): see PipelineConfig.direct."""
        self._runner: asyncio.Runner | None = None
        self._replaced = 0
        self.ledger = DrawLedger()
        """Every task of the run's steps, from its draw to its group (the loop decides its fate)."""

    def sample(
        self, tasks: Sequence[Task], params: SamplingParams, step: int
    ) -> tuple[list[list[Rollout]], dict[str, float]]:
        """Every group of the step (first round, then replacement rounds) and the pipeline's stats.
        `tasks` were just drawn from the pool for loop step `step` (registered in the ledger here)."""
        ids = self.ledger.drawn(tasks, step)
        self.workers.sync()
        if self.direct:
            groups, stats = self._sample_direct(list(tasks), ids, params, step)
        else:
            self._runner = self._runner or asyncio.Runner()  # one event loop for every step
            groups, stats = self._runner.run(self._sample(list(tasks), ids, params, step))
        if self._events is not None:
            self._events("pipeline", f"rollout step {step}", None, {"step": step, **stats})
        return groups, stats

    async def _sample(
        self, tasks: list[Task], ids: list[str], params: SamplingParams, step: int
    ) -> tuple[list[list[Rollout]], dict[str, float]]:
        seed = stable_hash("rollout", self.seed, step)
        groups: list[list[Rollout]] = []
        async with Pipeline(
            self.config, self.workers, params, self.scheduler, group_prefix=f"{step}:", seed=seed, budgets=self.budgets
        ) as pipe:
            for round_ in range(self.config.replace_rounds + 1):
                tasks, ids = self._keep(groups, await pipe.run_groups(tasks), round_, ids, step)
                if not tasks:
                    break
            stats = pipe.stats().flat()
        return groups, self._step_stats(stats)

    def _sample_direct(
        self, tasks: list[Task], ids: list[str], params: SamplingParams, step: int
    ) -> tuple[list[list[Rollout]], dict[str, float]]:
        """As `_sample`, through the inline scheduler (pipeline/play.py): no event loop, no stages."""
        seed = stable_hash("rollout", self.seed, step)
        direct = Play.direct(
            self.config, self.workers, params, self.scheduler, prefix=f"{step}:", seed=seed, budgets=self.budgets
        )
        groups: list[list[Rollout]] = []
        for round_ in range(self.config.replace_rounds + 1):
            tasks, ids = self._keep(groups, direct.run_groups(tasks), round_, ids, step)
            if not tasks:
                break
        return groups, self._step_stats(direct.stats().flat())

    def _keep(
        self, groups: list[list[Rollout]], results: Sequence[GroupResult | None], round_: int, ids: list[str], step: int
    ) -> tuple[list[Task], list[str]]:
        """Add a round's groups to `groups` (each bound to its draw of `ids`, a paused task's draw
        dropped); the next round's tasks and their draw ids: a fresh draw for each group dynamic
        sampling would filter ([] when none is missing or the rounds are used up)."""
        for draw, result in zip(ids, results, strict=True):  # each returned group bound to its draw
            if result is None:  # skipped: its domain paused
                self.ledger.dropped(draw, "paused", step)
            else:
                self.ledger.bind(draw, result.rollouts[0].group_id)
        new = [list(r.rollouts) for r in results if r is not None]
        groups += new
        missing = sum(not informative(g) for g in new) if self.dynamic_sampling else 0
        if not missing or round_ == self.config.replace_rounds:
            return [], []
        self._replaced += missing
        tasks = self.pool.draw(missing)
        return tasks, self.ledger.drawn(tasks, step)

    def _step_stats(self, stats: dict[str, float]) -> dict[str, float]:
        replaced, self._replaced = self._replaced, 0
        stats["pipe_replaced"] = float(replaced)
        stats["pipe_direct"] = float(self.direct)
        stats.update(self.workers.pool_stats())  # runtime ray: actors per stage, pool changes
        for name, row in self.scheduler.mix().items():
            stats[f"mix_{name}"] = round(row["realised"], 4)
        return stats

    def close(self) -> None:
        if self._runner is not None:
            self._runner.close()
        self.workers.close()
