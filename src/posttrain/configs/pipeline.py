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
    ray_address: str | None = None
    """With runtime ray: the cluster address (None: start a local cluster; "auto": the one running here)."""
    direct: bool = True
    """Run an on-policy step's groups without the asyncio stages when every domain of the run
    is single-turn, executes nothing and has a `cheap` verifier, in the embedded runtime with
    verification in threads and no generate timeout (pipeline/direct.py): same groups, seeds
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
        if self.long_slots >= self.max_inflight:
            raise ValueError(f"long_slots ({self.long_slots}) must be < max_inflight ({self.max_inflight})")
        return self


Runtime = Literal["embedded", "ray"]
