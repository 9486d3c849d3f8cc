"""The closed loop's rollout step through the pipeline: one step's tasks in, groups out.

Invariant: `sample` returns one group per task it ran, in task order (tasks
of a paused domain are skipped and counted, never generated), each group's
samples seeded by (run seed, step, group index) so results do not depend on
batching, on the runtime (embedded threads or Ray actors) or on the path
(the direct path, pipeline/direct.py, when every domain allows it; else the
staged pipeline on one event loop kept for the run); replacement rounds draw
fresh tasks for groups dynamic sampling filtered, and count them.
Every task it is given or draws is registered in `ledger` (pipeline/draws.py)
when drawn, bound to the group made from it, or dropped there when it never
becomes a returned group (a paused domain; a group too stale in `_Ahead`);
the loop decides the returned groups' fates.
With pipeline.max_staleness > 0 (`_Ahead`), the groups returned at call N are
those of the tasks given at call N-1, generated while the trainer trained,
and none is more than max_staleness weight versions old.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from posttrain.configs.pipeline import PipelineConfig, Runtime
from posttrain.domains.base import Budget, stable_hash
from posttrain.errors import ConfigError
from posttrain.pipeline.core import GroupResult, Pipeline
from posttrain.pipeline.direct import Direct
from posttrain.pipeline.draws import DrawLedger
from posttrain.pipeline.scheduler import EventSink, Scheduler
from posttrain.pipeline.workers import DomainExecute, EmbeddedWorkers, ExecuteFn, Workers
from posttrain.rollout import Rollout, informative
from posttrain.types import SamplingParams, Task


def make_workers(
    runtime: Runtime,
    config: PipelineConfig,
    engine: Any,
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
    if config.max_staleness > 0:  # generation overlaps training: it needs its own copy of the weights
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

    if not hasattr(engine, "model") or not hasattr(engine, "tokenizer"):
        raise ConfigError("pipeline.max_staleness > 0 in the embedded runtime needs an hf engine to copy")
    twin = HFEngine(copy.deepcopy(engine.model), engine.tokenizer, seed=0)
    twin.version = engine.version
    return twin


def trace_events(trace: Any, log: Callable[[str], None]) -> EventSink:
    """An event sink that keeps each event in the trace's events table; alarms are also logged."""

    def sink(kind: str, message: str, domain: str | None, data: Mapping[str, Any]) -> None:
        trace.add_event(kind, message, step=data.get("step"), domain=domain, data=dict(data))
        if kind in ("alarm", "recovered"):
            log(f"{kind}: {message}")

    return sink


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
        tiers = {n: pool.domains[n].cost_class for n in pool.names}
        specs = pool.specs  # per-domain quotas and priorities (tasks.domains.<name>)
        self.scheduler = Scheduler(
            config,
            pool.target_shares(),
            tiers,
            events,
            quotas={n: s.max_inflight for n, s in specs.items()},
            priorities={n: s.priority for n, s in specs.items()},
        )
        self.totals: dict[str, int] = {"replaced": 0}
        self._events = events
        self._ahead: _Ahead | None = _Ahead(self) if config.max_staleness > 0 else None
        self.direct = bool(
            self._ahead is None
            and config.direct
            and config.generate_timeout_s is None
            and all(workers.inline(n) for n in pool.names)
        )
        """Every step runs through pipeline/direct.py (no asyncio stages): see PipelineConfig.direct."""
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
        if self._ahead is not None:
            groups, stats = self._ahead.sample(list(tasks), ids, params, step)
        else:
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
        """As `_sample`, through pipeline/direct.py: no event loop, no stages."""
        direct = Direct(
            self.config,
            self.workers,
            params,
            self.scheduler,
            group_prefix=f"{step}:",
            seed=stable_hash("rollout", self.seed, step),
            budgets=self.budgets,
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
        self._settle(ids, results, step)
        new = [list(r.rollouts) for r in results if r is not None]
        groups += new
        missing = sum(not informative(g) for g in new) if self.dynamic_sampling else 0
        if not missing or round_ == self.config.replace_rounds:
            return [], []
        self._replaced += missing
        tasks = self.pool.draw(missing)
        return tasks, self.ledger.drawn(tasks, step)

    def _settle(self, ids: Sequence[str], results: Sequence[GroupResult | None], step: int) -> None:
        """Bind each returned group to its draw (`results` in the order of `ids`); a task the
        pipeline skipped (None: its domain paused) is dropped."""
        for draw, result in zip(ids, results, strict=True):
            if result is None:
                self.ledger.dropped(draw, "paused", step)
            else:
                self.ledger.bind(draw, result.rollouts[0].group_id)

    def _step_stats(self, stats: dict[str, float]) -> dict[str, float]:
        replaced, self._replaced = self._replaced, 0
        self.totals["replaced"] += replaced
        stats["pipe_replaced"] = float(replaced)
        stats["pipe_direct"] = float(self.direct)
        for name, row in self.scheduler.mix().items():
            stats[f"mix_{name}"] = round(row["realised"], 4)
        return stats

    def mix(self) -> Mapping[str, Mapping[str, float]]:
        return self.scheduler.mix()

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.close()
        if self._runner is not None:
            self._runner.close()
        self.workers.close()


class _Ahead:
    """Off-policy mode (pipeline.max_staleness > 0): the tasks of call N are generated
    in a background event loop while the trainer trains on the groups of call N-1;
    call N returns the groups of the tasks given at call N-1 (the first call runs its
    own tasks at once and draws one extra batch from the pool to start the overlap).
    A group whose weights are more than max_staleness versions behind the trainer's
    is dropped and counted (in metrics, not in the trace); the loss corrects accepted
    ones with their behaviour log-probs, and its draw is dropped ("stale") in the ledger.
    Stage stats are cumulative over the run.
    The pipeline lives in one task of the background loop (its TaskGroup's owner);
    a crash there surfaces from the next `sample`."""

    def __init__(self, owner: StepRollouts) -> None:
        import threading

        self.owner = owner
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="rollout-pipeline", daemon=True)
        self.thread.start()
        self.pipe: Pipeline | None = None
        self.serving: Any = None
        self.pending: Any = None
        self.pending_ids: list[str] = []
        self.dropped = 0

    async def _serve(self, params: SamplingParams, ready: Any) -> None:
        owner = self.owner
        self._stop = asyncio.Event()
        async with Pipeline(
            owner.config,
            owner.workers,
            params,
            owner.scheduler,
            seed=stable_hash("rollout", owner.seed),
            budgets=owner.budgets,
        ) as pipe:
            self.pipe = pipe
            ready.set()
            await self._stop.wait()

    def _start(self, params: SamplingParams) -> None:
        import threading

        ready = threading.Event()
        self.serving = asyncio.run_coroutine_threadsafe(self._serve(params, ready), self.loop)
        while not ready.wait(0.05):
            if self.serving.done():
                self.serving.result()  # raises what stopped it

    def _submit(self, tasks: list[Task], ids: list[str], step: int) -> None:
        assert self.pipe is not None
        self.pending_ids = ids
        self.pending = asyncio.run_coroutine_threadsafe(self.pipe.run_groups(tasks, prefix=f"{step}:"), self.loop)

    def _wait(self) -> list[Any]:
        import concurrent.futures as cf

        cf.wait([self.pending, self.serving], return_when=cf.FIRST_COMPLETED)
        if self.serving.done():
            self.serving.result()
            raise RuntimeError("the rollout pipeline stopped")
        return self.pending.result()

    def sample(
        self, tasks: list[Task], ids: list[str], params: SamplingParams, step: int
    ) -> tuple[list[list[Rollout]], dict[str, float]]:
        owner = self.owner
        if self.pipe is None:
            self._start(params)
            self._submit(tasks, ids, step)
            tasks = owner.pool.draw(len(tasks))
            ids = owner.ledger.drawn(tasks, step)
        got, got_ids = self._wait(), self.pending_ids
        owner._settle(got_ids, got, step)
        results = [r for r in got if r is not None]
        owner.workers.sync()
        self._submit(tasks, ids, step + 1)
        version = owner.workers.driver_version
        fresh = [r for r in results if version - r.model_version <= owner.config.max_staleness]
        for r in results:
            if version - r.model_version > owner.config.max_staleness:
                draw = owner.ledger.draw_of(r.rollouts[0].group_id)
                assert draw is not None
                owner.ledger.dropped(draw, f"stale: {version - r.model_version} versions behind", step)
        self.dropped += len(results) - len(fresh)
        assert self.pipe is not None
        stats = self.pipe.stats().flat()
        stats.update(
            pipe_dropped_stale=float(len(results) - len(fresh)),
            pipe_staleness_max=float(max((version - r.model_version for r in results), default=0)),
        )
        return [list(r.rollouts) for r in fresh], stats

    def close(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
        if self.serving is not None and not self.serving.done():
            self.loop.call_soon_threadsafe(self._stop.set)
            try:
                self.serving.result(timeout=60)
            except Exception:
                pass  # closing: a crash already surfaced from sample()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()
