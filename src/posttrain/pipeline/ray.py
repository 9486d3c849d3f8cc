"""`runtime: ray`: generation, execution (sandbox) and verification workers as Ray actors,
beside the embedded runtime (`workers.py`). Ray is imported only when `runtime: ray` is chosen.

Invariant: a runtime only changes where the pipeline's worker calls execute, never
what they compute (tests/pipeline/test_pipeline_ray.py): the actors compute exactly
what the embedded workers compute (the generation actor runs the same engine class on the same weights and
the requests carry their seeds; the verifier actor calls the same
`verify_group`), so a run's rollouts do not depend on the runtime; actors
restart when they die (the call in flight fails as an infra error, which
the pipeline retries), and weights reach the generation actors whenever the
driver's engine version moves. Multi-turn episodes are stepped by the
same `envs.driver` code as in the embedded runtime, in the pipeline's
process (an environment is stateful: it stays with its episode); the
execute stage after an episode and verification run on the actors. File domains (`tasks.domains.NAME.source`)
reach the execution and verification actors as their specs in the actors'
environment; the files themselves must be readable at the same path on every node.
Every actor declares the resources it uses (`actor_options`: `pipeline.generate_cpus`,
`generate_gpus`, `execute_cpus`, `verify_cpus`), so Ray places it by them; on a local
cluster (no `ray_address`), declarations it cannot hold are a ConfigError; custom resources
(`pipeline.<stage>_resources`, e.g. {sandbox_slot: 1}) are declared and checked the same way.
A call goes to a free actor of its stage (none free: it waits for one), so an actor runs one
call at a time. With `pipeline.elastic.enabled`, the pipeline runs each stage's `max` calls and
an `ElasticController` (pipeline/elastic.py) resizes the pools: looked at when a call starts
or ends or waits for an actor, once per `period_s`; an actor is added only when the
cluster's resources (less what this run's actors declare) hold it, and removed only with no
call in flight (a busy one is drained: no new call, killed when its call ends). Every change
is counted in `pool_stats()`.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.configs.pipeline import STAGES, PipelineConfig
from posttrain.domains.registry import SOURCE_ENV
from posttrain.errors import ConfigError
from posttrain.pipeline.elastic import Change, ElasticController, StageLoad
from posttrain.pipeline.workers import DomainExecute, ExecuteFn, Verdict, execute_one, verify_group
from posttrain.types import Completion, Episode, GenerationRequest, Message, Task


class HFEngineFactory:
    """Builds an HFEngine in the actor from a picklable model and tokenizer, on `device`
    with torch on `threads` threads (what the actor declares: `actor_options`)."""

    def __init__(self, model: Any, tokenizer: Any, threads: int = 1, device: str = "cpu") -> None:
        self.model, self.tokenizer, self.threads, self.device = model, tokenizer, threads, device

    def __call__(self) -> Any:
        import torch

        from posttrain.engine.hf import HFEngine

        torch.set_num_threads(self.threads)
        return HFEngine(self.model, self.tokenizer, device=self.device, seed=0)


def actor_options(config: PipelineConfig) -> dict[str, dict[str, Any]]:
    """Per stage, the resources its actors declare to Ray (`pipeline.<stage>_cpus`, and
    `generate_gpus`), so Ray places them by what they use."""
    out: dict[str, dict[str, Any]] = {
        "generate": {"num_cpus": config.generate_cpus, "num_gpus": config.generate_gpus},
        "execute": {"num_cpus": config.execute_cpus},
        "verify": {"num_cpus": config.verify_cpus},
    }
    for stage in STAGES:
        if config.resources(stage):
            out[stage]["resources"] = dict(config.resources(stage))
    return out


def _add(a: dict[str, float], b: Mapping[str, float], times: float = 1.0) -> dict[str, float]:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0.0) + times * v
    return out


def declared(options: Mapping[str, Any]) -> dict[str, float]:
    """One actor's declaration in Ray's resource names (CPU, GPU and the custom ones)."""
    base = {"CPU": float(options.get("num_cpus", 0.0)), "GPU": float(options.get("num_gpus", 0.0))}
    return _add(base, options.get("resources", {}))


CPU_FIELDS = ("generate_cpus", "execute_cpus", "verify_cpus")


def fit_defaults(config: PipelineConfig, total: Mapping[str, float]) -> PipelineConfig:
    """`config` with its *default* CPU declarations scaled to a local cluster of `total` that
    cannot hold them: when the actors' CPUs exceed the cluster's and no `pipeline.*_cpus` was
    set by the user, each stage's CPUs are multiplied by cluster CPUs / declared CPUs (rounded
    down to 0.01, at least 0.01), so the default config starts on any machine. A CPU demand the
    user wrote is kept as written (`check_fits` then names it when it cannot fit)."""
    if any(f in config.model_fields_set for f in CPU_FIELDS):
        return config
    per = actor_options(config)
    need = sum(declared(per[stage])["CPU"] * config.workers(stage) for stage in STAGES)
    have = float(total.get("CPU", 0.0))
    if need <= have + 1e-9 or have <= 0:
        return config
    scale = have / need
    update = {f: max(0.01, math.floor(getattr(config, f) * scale * 100) / 100) for f in CPU_FIELDS}
    fitted = config.model_copy(update=update)
    object.__setattr__(fitted, "__pydantic_fields_set__", set(config.model_fields_set))  # still defaults
    return fitted


def check_fits(config: PipelineConfig, total: dict[str, float]) -> None:
    """ConfigError when the actors' declared resources (CPUs, GPUs, custom) exceed the cluster's
    `total` (a local cluster, not one named by `ray_address`: they would wait for resources
    forever). With elastic pools, each stage's `min` actors must fit together (the starting
    counts are checked too: they are what starts)."""
    per = actor_options(config)
    need: dict[str, float] = {}
    for stage in STAGES:
        need = _add(need, declared(per[stage]), config.workers(stage))
    short = {k: v for k, v in need.items() if v > total.get(k, 0.0) + 1e-9}
    if short:
        have = {k: total.get(k, 0.0) for k in short}
        raise ConfigError(
            f"runtime ray: the actors declare {short} but the local cluster has {have}: lower "
            "pipeline.generate_cpus / execute_cpus / verify_cpus / generate_gpus / *_resources or the *_workers counts"
        )


@dataclass
class _Slot:
    actor: Any
    inflight: int = 0


class StagePool:
    """One stage's actors. `acquire` hands out a free actor (waiting while all are busy);
    `release` gives it back; `grow` and `shrink` change the count (a busy actor leaving is
    drained: killed once its call ends). Idle share and backlog are measured for the controller."""

    def __init__(self, stage: str, make: Callable[[], Any], count: int, need: Mapping[str, float], ray: Any) -> None:
        self.stage, self.make, self.need, self._ray = stage, make, dict(need), ray
        self.actors: list[Any] = []
        self.slots: list[_Slot] = []
        self.draining: list[_Slot] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._busy_s = self._cap_s = self._wait_s = self._span_s = 0.0
        self._last: float | None = None
        self.on_wait: Callable[[], None] | None = None
        """Called when a call starts waiting (RayWorkers: the controller's look)."""
        for _ in range(count):
            self._spawn()

    def _spawn(self) -> _Slot:
        slot = _Slot(self.make())
        self.slots.append(slot)
        self.actors.append(slot.actor)
        return slot

    def held(self) -> dict[str, float]:
        """What this pool's actors declare, draining ones included (they still hold it)."""
        return {k: v * (len(self.slots) + len(self.draining)) for k, v in self.need.items()}

    def account(self, now: float) -> None:
        if self._last is not None:
            dt = now - self._last
            self._busy_s += dt * sum(1 for s in self.slots if s.inflight)
            self._cap_s += dt * len(self.slots)
            self._wait_s += dt * len(self._waiters)
            self._span_s += dt
        self._last = now

    def load(self, now: float) -> StageLoad:
        """The load since the last call of `load` (then the measure restarts)."""
        self.account(now)
        idle = 1.0 - self._busy_s / self._cap_s if self._cap_s > 0 else 1.0
        waiting = self._wait_s / self._span_s if self._span_s > 0 else float(len(self._waiters))
        self._busy_s = self._cap_s = self._wait_s = self._span_s = 0.0
        return StageLoad(len(self.slots), waiting, max(0.0, idle))

    async def acquire(self, now: Callable[[], float]) -> _Slot:
        while True:
            free = [s for s in self.slots if not s.inflight]
            if free:
                self.account(now())
                free[0].inflight += 1
                return free[0]
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.account(now())
            self._waiters.append(fut)
            if self.on_wait is not None:  # the backlog is at its height: the controller may look
                self.on_wait()
            try:
                await fut
            finally:
                self.account(now())
                self._waiters.remove(fut)

    def release(self, slot: _Slot, now: float) -> None:
        self.account(now)
        slot.inflight -= 1
        if slot in self.draining and not slot.inflight:
            self.draining.remove(slot)
            self._ray.kill(slot.actor, no_restart=True)
        self._wake()

    def _wake(self) -> None:
        for w in self._waiters:
            if not w.done():
                w.set_result(None)
                return

    def grow(self) -> Any:
        slot = self._spawn()
        self._wake()
        return slot.actor

    def shrink(self) -> None:
        """One actor fewer: an idle one is killed now; else the last one is drained."""
        idle = [s for s in self.slots if not s.inflight]
        slot = idle[-1] if idle else self.slots[-1]
        self.slots.remove(slot)
        self.actors.remove(slot.actor)
        if slot.inflight:
            self.draining.append(slot)
        else:
            self._ray.kill(slot.actor, no_restart=True)

    def close(self) -> None:
        for s in (*self.slots, *self.draining):
            self._ray.kill(s.actor, no_restart=True)
        self.slots, self.draining, self.actors[:] = [], [], []


class GenerationWorker:
    def __init__(self, factory: Callable[[], Any]) -> None:
        self.engine = factory()

    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        return self.engine.generate(requests)

    def end_sessions(self, keys: Sequence[str]) -> None:
        self.engine.end_sessions(keys)

    def load(self, state: Any, version: int) -> int:
        self.engine.update_weights(state)
        self.engine.version = version
        return version


class ExecutionWorker:
    def __init__(self, execute: ExecuteFn | None) -> None:
        self.run = execute

    def execute(self, task: Task, completions: Sequence[Completion]) -> tuple[Any, ...]:
        return tuple(None if self.run is None else execute_one(self.run, task, c) for c in completions)


class VerifierWorker:
    def verify(self, task: Task, episodes: Sequence[Episode]) -> tuple[Verdict, ...]:
        return verify_group(task, episodes)


class RayWorkers:
    """The pipeline's Workers backed by Ray actors (a local or a remote cluster)."""

    def __init__(
        self,
        config: PipelineConfig,
        factory: Callable[[], Any],
        encoder: Any,
        execute: ExecuteFn | None = DomainExecute(),
        address: str | None = None,
        state_source: Any = None,
    ) -> None:
        try:
            import ray
        except ImportError as exc:  # pragma: no cover - ray is in the scale extra
            raise ConfigError("runtime: ray needs the `ray` package (pip install 'posttrain[scale]')") from exc
        self._ray = ray
        self._owns = not ray.is_initialized()
        if self._owns:
            # a local cluster posttrain starts gets pipeline.ray_resources (custom resources of its node)
            extra = {"resources": dict(config.ray_resources)} if address is None and config.ray_resources else {}
            ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True, **extra)
        if address is None:  # a local cluster (started here or by this process): what does not fit never starts
            config = fit_defaults(config, ray.cluster_resources())  # default CPU declarations fit the machine
            check_fits(config, ray.cluster_resources())
        self._total = dict(ray.cluster_resources())
        opts: dict[str, Any] = {"max_restarts": -1}
        per = actor_options(config)
        sources = os.environ.get(SOURCE_ENV)  # file domains: actors rebuild them by name from their specs
        scoring = {**opts, "runtime_env": {"env_vars": {SOURCE_ENV: sources}}} if sources else opts
        makers: dict[str, Callable[[], Any]] = {
            "generate": lambda: ray.remote(GenerationWorker).options(**opts, **per["generate"]).remote(factory),
            "execute": lambda: ray.remote(ExecutionWorker).options(**scoring, **per["execute"]).remote(execute),
            "verify": lambda: ray.remote(VerifierWorker).options(**scoring, **per["verify"]).remote(),
        }
        self.pools = {
            stage: StagePool(stage, makers[stage], config.workers(stage), declared(per[stage]), ray) for stage in STAGES
        }
        self.generators = self.pools["generate"].actors
        self.executors = self.pools["execute"].actors
        self.verifiers = self.pools["verify"].actors
        self.encoder = encoder
        self._source = state_source
        self._synced = -1  # the first sync stamps the actors with the driver's version
        self._state_ref: Any = None  # the weights of the last sync (a new generation actor loads them)
        self.elastic = config.elastic
        self.controller = ElasticController(config.elastic) if config.elastic.enabled else None
        self.clock: Callable[[], float] = time.monotonic
        self._looked: float | None = None
        self.changes: list[Change] = []
        """Every pool change of the run, in order."""
        self.counts = {"grown": 0, "shrunk": 0, "blocked": 0}
        if self.controller is not None:
            for pool in self.pools.values():
                pool.on_wait = self._look

    @classmethod
    def from_engine(
        cls,
        engine: Any,
        config: PipelineConfig,
        address: str | None = None,
        execute: ExecuteFn | None = DomainExecute(),
    ) -> RayWorkers:
        """Generation actors running the same HF engine on a copy of `engine`'s weights."""
        if not engine.in_process:  # Engine.in_process: the hf engine, whose model and tokenizer the actors copy
            raise ConfigError("runtime: ray builds generation actors from an hf engine (model and tokenizer)")
        device = "cuda" if config.generate_gpus > 0 else "cpu"
        factory = HFEngineFactory(engine.model, engine.tokenizer, max(1, int(config.generate_cpus)), device)
        return cls(config, factory, engine, execute, address or config.ray_address, engine)

    def cheap_verifier(self, domain: str) -> bool:
        """Never: verification runs in the verifier actors."""
        return False

    def inline(self, domain: str) -> bool:
        """Never: generation and verification run in actors, through the stages."""
        return False

    def sync(self) -> None:
        """Push the driver engine's weights to every generation actor when its version moved."""
        src = self._source
        if src is None or src.version == self._synced:
            return
        state = {k: v.detach().cpu() for k, v in src.model.state_dict().items()}
        ref = self._ray.put(state)
        self._ray.get([g.load.remote(ref, src.version) for g in self.generators])
        self._synced, self._state_ref = src.version, ref

    # ---- elastic pools -------------------------------------------------
    def _look(self) -> None:
        """The controller's look, once per `period_s` (called as calls start and end)."""
        if self.controller is None:
            return
        now = self.clock()
        if self._looked is None:
            self._looked = now
            for p in self.pools.values():
                p.account(now)
            return
        if now - self._looked < self.elastic.period_s:
            return
        self._looked = now
        loads = {stage: p.load(now) for stage, p in self.pools.items()}
        for change in self.controller.decide(now, loads):
            self._apply(change)

    def _apply(self, change: Change) -> None:
        pool = self.pools[change.stage]
        if change.after < change.before:
            for _ in range(change.before - change.after):
                pool.shrink()
            self.counts["shrunk"] += 1
        else:
            held: dict[str, float] = {}
            for p in self.pools.values():
                held = _add(held, p.held())
            room = _add(held, pool.need, change.after - change.before)
            if any(v > self._total.get(k, 0.0) + 1e-9 for k, v in room.items() if v > 0):
                self.counts["blocked"] += 1
                if self.controller is not None:
                    self.controller.undo(change)
                return
            for _ in range(change.after - change.before):
                actor = pool.grow()
                if change.stage == "generate" and self._state_ref is not None:
                    actor.load.remote(self._state_ref, self._synced)  # before any generate call it gets
            self.counts["grown"] += 1
        self.changes.append(change)

    def pool_stats(self) -> dict[str, float]:
        """Per-step metrics: each stage's actors now, and the pool changes so far (cumulative)."""
        out = {f"pool_{s}_workers": float(len(p.slots)) for s, p in self.pools.items()}
        out.update({f"pool_{k}": float(v) for k, v in self.counts.items()})
        out["pool_changes"] = float(len(self.changes))
        return out

    async def _call(self, stage: str, method: str, *args: Any) -> Any:
        pool = self.pools[stage]
        self._look()
        slot = await pool.acquire(self.clock)
        try:
            return await getattr(slot.actor, method).remote(*args)
        finally:
            pool.release(slot, self.clock())
            self._look()

    async def encode(self, messages: Sequence[Message]) -> tuple[int, ...]:
        return self.encoder.encode_chat(messages)

    async def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        return await self._call("generate", "generate", requests)

    def end_sessions(self, keys: Sequence[str]) -> None:
        """Sent to every generation actor, not waited for (an actor runs it after its current call).
        A call goes to whichever actor is free, so with several a session's next turn may land on
        another actor than the one keeping it: that turn is computed in full."""
        for g in self.generators:
            g.end_sessions.remote(list(keys))

    async def execute(self, task: Task, completions: Sequence[Completion]) -> tuple[Any, ...]:
        return await self._call("execute", "execute", task, tuple(completions))

    async def verify(self, task: Task, episodes: Sequence[Episode]) -> tuple[Verdict, ...]:
        return await self._call("verify", "verify", task, tuple(episodes))

    def close(self) -> None:
        for pool in self.pools.values():
            pool.close()
        self.generators = self.executors = self.verifiers = []
        if self._owns:
            self._ray.shutdown()
