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
cluster (no `ray_address`), declarations it cannot hold are a ConfigError.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any

from posttrain.configs.pipeline import PipelineConfig
from posttrain.domains.registry import SOURCE_ENV
from posttrain.errors import ConfigError
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
    return {
        "generate": {"num_cpus": config.generate_cpus, "num_gpus": config.generate_gpus},
        "execute": {"num_cpus": config.execute_cpus},
        "verify": {"num_cpus": config.verify_cpus},
    }


def check_fits(config: PipelineConfig, total: dict[str, float]) -> None:
    """ConfigError when the actors' declared resources exceed the cluster's `total`
    (a local cluster, not one named by `ray_address`: they would wait for resources forever)."""
    need = {
        "CPU": config.generate_workers * config.generate_cpus
        + config.execute_workers * config.execute_cpus
        + config.verify_workers * config.verify_cpus,
        "GPU": config.generate_workers * config.generate_gpus,
    }
    short = {k: v for k, v in need.items() if v > total.get(k, 0.0) + 1e-9}
    if short:
        have = {k: total.get(k, 0.0) for k in short}
        raise ConfigError(
            f"runtime ray: the actors declare {short} but the local cluster has {have}: lower "
            "pipeline.generate_cpus / execute_cpus / verify_cpus / generate_gpus or the *_workers counts"
        )


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
            ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        if address is None:  # a local cluster (started here or by this process): what does not fit never starts
            check_fits(config, ray.cluster_resources())
        opts: dict[str, Any] = {"max_restarts": -1}
        per = actor_options(config)
        sources = os.environ.get(SOURCE_ENV)  # file domains: actors rebuild them by name from their specs
        scoring = {**opts, "runtime_env": {"env_vars": {SOURCE_ENV: sources}}} if sources else opts
        self.generators = [
            ray.remote(GenerationWorker).options(**opts, **per["generate"]).remote(factory)
            for _ in range(config.generate_workers)
        ]
        self.executors = [
            ray.remote(ExecutionWorker).options(**scoring, **per["execute"]).remote(execute)
            for _ in range(config.execute_workers)
        ]
        self.verifiers = [
            ray.remote(VerifierWorker).options(**scoring, **per["verify"]).remote()
            for _ in range(config.verify_workers)
        ]
        self._rr = {
            k: itertools.cycle(v) for k, v in (("g", self.generators), ("e", self.executors), ("v", self.verifiers))
        }
        self.encoder = encoder
        self._source = state_source
        self._synced = -1  # the first sync stamps the actors with the driver's version

    @classmethod
    def from_engine(
        cls,
        engine: Any,
        config: PipelineConfig,
        address: str | None = None,
        execute: ExecuteFn | None = DomainExecute(),
    ) -> RayWorkers:
        """Generation actors running the same HF engine on a copy of `engine`'s weights."""
        if not hasattr(engine, "model") or not hasattr(engine, "tokenizer"):
            raise ConfigError("runtime: ray builds generation actors from an hf engine (model and tokenizer)")
        return cls(
            config,
            HFEngineFactory(
                engine.model,
                engine.tokenizer,
                threads=max(1, int(config.generate_cpus)),
                device="cuda" if config.generate_gpus > 0 else "cpu",
            ),
            engine,
            execute,
            address or config.ray_address,
            engine,
        )

    @property
    def driver_version(self) -> int:
        return 0 if self._source is None else int(self._source.version)

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
        self._synced = src.version

    async def encode(self, messages: Sequence[Message]) -> tuple[int, ...]:
        return self.encoder.encode_chat(messages)

    async def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        return await next(self._rr["g"]).generate.remote(requests)

    def end_sessions(self, keys: Sequence[str]) -> None:
        """Sent to every generation actor, not waited for (an actor runs it after its current call).
        Calls go round-robin over the actors, so with several a session's next turn may land on
        another actor than the one keeping it: that turn is computed in full."""
        for g in self.generators:
            g.end_sessions.remote(list(keys))

    async def execute(self, task: Task, completions: Sequence[Completion]) -> tuple[Any, ...]:
        return await next(self._rr["e"]).execute.remote(task, tuple(completions))

    async def verify(self, task: Task, episodes: Sequence[Episode]) -> tuple[Verdict, ...]:
        return await next(self._rr["v"]).verify.remote(task, tuple(episodes))

    def close(self) -> None:
        for actor in (*self.generators, *self.executors, *self.verifiers):
            self._ray.kill(actor)
        self.generators = self.executors = self.verifiers = []
        if self._owns:
            self._ray.shutdown()
