"""Typed pipeline configuration: stage workers, queues, scheduler, staleness.

Invariant: a PipelineConfig that validates is runnable as is: every count
and bound the pipeline relies on is checked here (long slots fit inside the
in-flight cap, the cap's floor is below its ceiling), unknown keys are
rejected, and the model is frozen.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_STRICT = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

STAGES = ("generate", "execute", "verify")


class StageBounds(BaseModel):
    """How few and how many actors one stage's elastic pool may hold."""

    model_config = _STRICT
    min: int = Field(1, ge=1, le=4096)
    """Fewest actors of the stage (the controller never removes below it)."""
    max: int = Field(4, ge=1, le=4096)
    """Most actors of the stage (the controller never adds above it); with elastic pools the
    pipeline runs this many concurrent calls of the stage, so calls wait on the actors."""

    @model_validator(mode="after")
    def _order(self) -> StageBounds:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class ElasticConfig(BaseModel):
    """With runtime ray: a controller that adds or removes one stage's actors within bounds
    by the stage's backlog and idle share, with hysteresis (pipeline/elastic.py)."""

    model_config = _STRICT
    enabled: bool = False
    """Resize the stages' actor pools while the run goes (False: the fixed `*_workers` counts)."""
    generate: StageBounds = StageBounds(min=1, max=1)
    """Bounds of the generation pool (a new generation actor gets the synced weights first)."""
    execute: StageBounds = StageBounds()
    """Bounds of the execution (sandbox) pool."""
    verify: StageBounds = StageBounds()
    """Bounds of the verification pool."""
    period_s: float = Field(1.0, gt=0.0, le=3600.0)
    """Seconds between two looks of the controller (it looks when a stage call starts, ends or waits,
    once this much time has passed since its last look; no timer runs)."""
    grow_backlog: float = Field(1.0, gt=0.0, le=1_000_000.0)
    """A stage grows when its backlog (calls waiting for a busy actor, on average over the period)
    per actor is at least this."""
    shrink_idle: float = Field(0.5, gt=0.0, le=1.0)
    """A stage shrinks when its actors' idle share over the last period is at least this and its
    backlog is below `grow_backlog` (it would not grow)."""
    hold_periods: int = Field(2, ge=1, le=1000)
    """Consecutive looks a grow or shrink condition must hold before the pool changes."""
    cooldown_s: float = Field(2.0, ge=0.0, le=86400.0)
    """Seconds after a change of a stage before that stage may change again."""

    def bounds(self, stage: str) -> StageBounds:
        return {"generate": self.generate, "execute": self.execute, "verify": self.verify}[stage]


class PipelineConfig(BaseModel):
    """The asynchronous rollout pipeline: generate -> execute -> verify."""

    model_config = _STRICT
    generate_workers: int = Field(1, ge=1, le=1024)
    """Concurrent generation calls (each one batches whatever groups are queued)."""
    generate_batch: int = Field(64, ge=1, le=65536)
    """Most groups one generation call takes from its queue at once."""
    execute_workers: int = Field(4, ge=1, le=4096)
    """Concurrent execution calls (sandbox runs, environment steps)."""
    verify_workers: int = Field(2, ge=1, le=1024)
    """Concurrent verification calls."""
    verify_processes: int = Field(0, ge=0, le=256)
    """Processes in the verification pool (0: verify in threads, for cheap
    verifiers and verifiers registered only in this process)."""
    queue_size: int = Field(64, ge=1, le=1_000_000)
    """Capacity of each bounded queue between stages (backpressure beyond it)."""
    gather_share: float = Field(0.1, ge=0.0, le=1000.0)
    """How long a generation call may wait for more groups before it starts, as a share of the last
    call's seconds (at most `gather_max_s`; the first call: `gather_max_s`), while groups are still
    on their way to generation: being admitted, in an environment or execute step, or backing off.
    It starts as soon as none is on its way (or `generate_batch` groups are in it), so a step's groups
    share one call and every episode's next turn another, instead of a call starting on the first
    group that arrives and the rest queueing behind it (docs/pipeline.md, "Shape").
    0: a call takes what is queued when the engine is free."""
    gather_max_s: float = Field(2.0, ge=0.0, le=600.0)
    """The longest a generation call waits for more groups (see `gather_share`)."""
    max_inflight: int = Field(64, ge=1, le=1_000_000)
    """Ceiling of groups admitted and not yet finished."""
    min_inflight: int = Field(4, ge=1, le=1_000_000)
    """Floor of the adaptive in-flight cap."""
    long_slots: int = Field(8, ge=0, le=1_000_000)
    """In-flight places reserved for long tasks (short tasks never take them,
    and long tasks never take more)."""
    mix_slack: int = Field(4, ge=0, le=1_000_000)
    """Groups a domain may fall behind its target count before admission waits for it."""
    domain_quota: int = Field(0, ge=0, le=1_000_000)
    """Most in-flight groups of one domain (0: no quota; `tasks.domains.<name>.max_inflight`
    overrides it per domain). On the direct path: most groups of one domain in one engine call."""
    max_retries: int = Field(2, ge=0, le=100)
    """Retries of a stage after an infra error (generation, an execute or environment step, a
    transient verifier failure) before what failed is masked and counted."""
    backoff_s: float = Field(0.05, ge=0.0, le=600.0)
    """First retry delay; each further retry doubles it."""
    generate_timeout_s: float | None = Field(None, gt=0.0)
    """A generation call that takes longer is an infra error (None: no timeout)."""
    degrade_after: int = Field(20, ge=1, le=1_000_000)
    """Consecutive groups with verifier failures after which a domain is paused (alarm)."""
    degrade_cooldown_s: float = Field(60.0, ge=0.0)
    """A paused domain gets one probe group after this many seconds."""
    mode: Literal["sync", "async"] = "sync"
    """How the loop gets its groups. sync: on-policy, one step at a time (every group of a
    step is generated from the weights after the previous step; exact resume). async: one
    long-lived pipeline streams groups while the trainer trains (pipeline/continuous.py):
    the trainer takes a batch when `rollout.prompts_per_step` groups are finished, within
    `max_staleness` weight versions of their admission; the order of groups depends on
    timing and resume is not exact (docs/pipeline.md, "The modes")."""
    max_staleness: int = Field(0, ge=0, le=1_000_000)
    """mode async: the most weight versions a trained group may lag the trainer, counted from
    its admission (the trainer waits for a group rather than let it pass the bound; a group
    whose completions still come out older, a lagging remote engine, is re-queued once at the
    front, then dropped and counted). 0 with async: streamed, but each group is trained on the
    weights it was admitted under. mode sync: must be 0 (sync is on-policy)."""
    replace_rounds: int = Field(0, ge=0, le=100)
    """Rounds of replacement for groups filtered by dynamic sampling or staleness
    in the per-step loop (the continuous pipeline always replaces)."""
    generate_cpus: float = Field(1.0, ge=0.0, le=1024.0)
    """With runtime ray: CPUs each generation actor declares (Ray places it by them); its engine
    runs torch on that many threads (at least one)."""
    generate_gpus: float = Field(0.0, ge=0.0, le=64.0)
    """With runtime ray: GPUs each generation actor declares; > 0 runs its engine on CUDA."""
    execute_cpus: float = Field(1.0, ge=0.0, le=1024.0)
    """With runtime ray: CPUs each execution actor declares (it runs one group's programs at a
    time, one after another: about one core while busy)."""
    verify_cpus: float = Field(1.0, ge=0.0, le=1024.0)
    """With runtime ray: CPUs each verifier actor declares (one group's verifier calls at a time)."""
    generate_resources: dict[str, float] = Field(default_factory=dict)
    """With runtime ray: custom resources each generation actor declares (e.g. {engine_slot: 1});
    on a local cluster, checked against its declared resources like CPUs."""
    execute_resources: dict[str, float] = Field(default_factory=dict)
    """With runtime ray: custom resources each execution actor declares (e.g. {sandbox_slot: 1})."""
    verify_resources: dict[str, float] = Field(default_factory=dict)
    """With runtime ray: custom resources each verifier actor declares."""
    elastic: ElasticConfig = ElasticConfig()
    """With runtime ray: elastic stage pools (off by default; docs/scale-out.md)."""
    ray_address: str | None = None
    """With runtime ray: the cluster address (None: start a local cluster; "auto": the one running here)."""
    ray_resources: dict[str, float] = Field(default_factory=dict)
    """With runtime ray and no `ray_address`: custom resources of the local cluster posttrain
    starts (passed to `ray.init(resources=...)`), e.g. {sandbox_slot: 8} for actors that declare
    `execute_resources: {sandbox_slot: 1}`. Ignored with `ray_address` (that cluster's nodes
    declare their own with `ray start --resources`)."""
    direct: bool = True
    """Run an on-policy step's groups without the asyncio stages when every domain of the run
    is single-turn, executes nothing and has a `cheap` verifier, in the embedded runtime with
    verification in threads and no generate timeout (pipeline/play.py): same groups, seeds
    and results, less overhead. False: always the staged pipeline."""
    latency_window: int = Field(4096, ge=16, le=10_000_000)
    """Latencies kept per stage for percentiles."""

    @model_validator(mode="after")
    def _bounds(self) -> PipelineConfig:
        if self.min_inflight > self.max_inflight:
            raise ValueError(f"min_inflight ({self.min_inflight}) must be <= max_inflight ({self.max_inflight})")
        if self.mode == "sync" and self.max_staleness:
            raise ValueError(
                f"pipeline.max_staleness ({self.max_staleness}) bounds pipeline.mode async; mode sync is on-policy "
                "(staleness 0): set pipeline.mode=async"
            )
        bad_cluster = {k: v for k, v in self.ray_resources.items() if k in ("CPU", "GPU") or v < 0 or not k}
        if bad_cluster:
            raise ValueError(
                f"pipeline.ray_resources {bad_cluster}: custom resources need a name other than CPU/GPU "
                "and an amount >= 0"
            )
        for stage in STAGES:
            res = self.resources(stage)
            bad = {k: v for k, v in res.items() if k in ("CPU", "GPU") or v < 0 or not k}
            if bad:
                raise ValueError(
                    f"pipeline.{stage}_resources {bad}: custom resources need a name other than CPU/GPU "
                    f"(use pipeline.{stage}_cpus / generate_gpus) and an amount >= 0"
                )
            if self.elastic.enabled:
                b, n = self.elastic.bounds(stage), self.workers(stage)
                if not b.min <= n <= b.max:
                    raise ValueError(
                        f"pipeline.{stage}_workers ({n}) is the elastic pool's starting size: it must lie within "
                        f"pipeline.elastic.{stage} [{b.min}, {b.max}]"
                    )
        if self.long_slots >= self.max_inflight:
            raise ValueError(f"long_slots ({self.long_slots}) must be < max_inflight ({self.max_inflight})")
        return self

    def workers(self, stage: str) -> int:
        """The stage's configured (starting) worker count."""
        return {"generate": self.generate_workers, "execute": self.execute_workers, "verify": self.verify_workers}[
            stage
        ]

    def calls(self, stage: str) -> int:
        """Concurrent calls the pipeline runs for the stage: its `*_workers`, or with elastic
        pools its pool's `max` (the calls then wait on however many actors the pool holds)."""
        return self.elastic.bounds(stage).max if self.elastic.enabled else self.workers(stage)

    def resources(self, stage: str) -> dict[str, float]:
        """The stage's declared custom resources (`pipeline.<stage>_resources`)."""
        return {
            "generate": self.generate_resources,
            "execute": self.execute_resources,
            "verify": self.verify_resources,
        }[stage]


Runtime = Literal["embedded", "ray"]
