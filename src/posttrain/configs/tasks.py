"""Typed configuration of the task pool.

Invariant: a TasksConfig that validates names only bounded, documented
settings; unknown keys are rejected (extra="forbid"), and whether each
domain name exists is checked by `TaskPool` against the registry (the config
module itself imports no domain).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from posttrain.configs.byo import SourceConfig, VerifierSpec

BUILTIN_DOMAINS = ("add", "sub", "mul", "reverse", "sort")
REWARD_PARTS = ("outcome", "process", "efficiency", "moved")
"""The reward parts a weight may name: outcome (the task's goal), process (how the
episode went: well-formed calls, a validator's acceptance, constraints met per
turn), efficiency (calls or turns against the budget), moved (the coding loop's
revisions that did not fail as the attempt before did)."""


class DomainSpec(BaseModel):
    """How one domain takes part in training."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    weight: float = Field(1.0, gt=0.0, le=1e6)
    """Relative sampling weight of the domain (> 0); shares are weight**(1/temperature), normalised."""

    difficulty: int | None = Field(None, ge=1)
    """A fixed difficulty level (1..domain.levels); None lets the curriculum choose."""

    source: SourceConfig | None = None
    """Bring your own tasks: a JSONL, CSV or Parquet file or a `datasets` directory read as this
    domain (the key is its name); None names a registered domain (built-in or plugin)."""

    max_tokens: int | None = Field(None, ge=1, le=1_000_000)
    """Tokens per turn for this domain (None: the domain's declared budget, `posttrain domains`)."""

    max_turns: int | None = Field(None, ge=1, le=10_000)
    """Turns per episode of a multi-turn domain (None: its declared budget)."""

    train_from_turn: int | None = Field(None, ge=1, le=10_000)
    """A multi-turn domain in training: the first turn whose actions carry the loss (None: 1, every
    action). 2 trains the revisions only: the first attempt gets no gradient of its own (SCoRe's
    first stage), so what RL moves is the answer to a failure; a derived task's prompt turns
    (`tasks.branch`) count. Past the turn budget: ConfigError. Evaluation is unchanged."""

    max_seconds: float | None = Field(None, gt=0.0, le=86_400.0)
    """Seconds per episode (None: its declared budget): the episode's own time (its environment
    steps and its share of the engine calls; not queueing or retries) and each execute step's
    runs together; past it the episode ends as truncated and is scored (docs/pipeline.md)."""

    priority: int = Field(0, ge=-1_000_000, le=1_000_000)
    """Admission priority of the domain's groups: pending groups of a higher priority are
    admitted first (ties: the pending order); a task's `meta.priority` overrides it."""

    max_inflight: int | None = Field(None, ge=1, le=1_000_000)
    """Most in-flight groups of this domain (None: `pipeline.domain_quota`, 0 there: no quota)."""

    reward_weights: dict[str, float] | None = None
    """Weights of the reward parts (outcome, process, efficiency, moved), e.g. {outcome: 1.0, process: 0.2,
    efficiency: 0.1}: the reward becomes the weighted mean of the weighted parts the domain reports;
    None keeps the domain's own reward (docs/domains.md lists the parts each family reports)."""

    verifier: VerifierSpec | None = None
    """How a `source` domain is scored: a verifier by name with parameters (default: exact).
    Only for `source` domains; registered domains keep their own verifier."""

    @model_validator(mode="after")
    def _verifier_needs_source(self) -> DomainSpec:
        if self.verifier is not None and self.source is None:
            raise ValueError("verifier is only for a domain with a source (a registered domain keeps its own verifier)")
        return self

    @field_validator("reward_weights")
    @classmethod
    def _check_weights(cls, weights: dict[str, float] | None) -> dict[str, float] | None:
        if weights is None:
            return None
        unknown = sorted(set(weights) - set(REWARD_PARTS))
        if unknown:
            raise ValueError(
                f"reward_weights: unknown part(s) {', '.join(map(repr, unknown))}; "
                f"the parts are {', '.join(REWARD_PARTS)}"
            )
        bad = {k: w for k, w in weights.items() if not math.isfinite(w) or w < 0}
        if bad:
            raise ValueError(f"reward_weights: weights must be finite and >= 0, got {bad}")
        if not any(w > 0 for w in weights.values()):
            raise ValueError("reward_weights: at least one weight must be > 0")
        return weights


class CurriculumConfig(BaseModel):
    """Difficulty tiers driven by the online pass rate of each (domain, level)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    """Use tiers. When False, a domain without a fixed difficulty draws its levels uniformly."""

    window: int = Field(64, ge=1, le=100_000)
    """Number of most recent rewards per (domain, level) that make up its pass rate."""

    min_samples: int = Field(16, ge=1, le=100_000)
    """Observations needed at the frontier level before it can advance or retreat."""

    promote_at: float = Field(0.8, gt=0.0, le=1.0)
    """A frontier level whose pass rate reaches this is mastered: the frontier moves up one level."""

    demote_at: float = Field(0.05, ge=0.0, lt=1.0)
    """A frontier level (above 1) whose pass rate falls to this or below is too hard: the frontier moves down."""

    warmup_share: float = Field(0.2, ge=0.0, le=1.0)
    """Share of a domain's draws from the warm-up tier (levels below the frontier)."""

    hard_share: float = Field(0.2, ge=0.0, le=1.0)
    """Share of a domain's draws from the hard tier (the level above the frontier); the rest is the frontier itself."""

    @model_validator(mode="after")
    def _check(self) -> CurriculumConfig:
        if self.warmup_share + self.hard_share > 1.0:
            raise ValueError("curriculum.warmup_share + curriculum.hard_share must be <= 1")
        if self.demote_at >= self.promote_at:
            raise ValueError("curriculum.demote_at must be below curriculum.promote_at")
        return self


class DriftConfig(BaseModel):
    """Capability-drift guard: a domain regressing on held-out while the others improve gets more weight."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    """Watch held-out results reported through `TaskPool.observe_eval`."""

    tolerance: float = Field(0.05, ge=0.0, le=1.0)
    """A drop of a domain's held-out pass rate below its best by more than this counts as a regression."""

    z: float = Field(1.96, ge=0.0, le=10.0)
    """... and only when the drop also exceeds this many standard errors of the two pass rates
    (binomial, from the evaluations' item counts), so a small eval subset's noise does not boost."""

    boost: float = Field(2.0, gt=1.0, le=100.0)
    """Factor applied to a regressing domain's weight at each evaluation it stays regressed."""

    max_boost: float = Field(8.0, ge=1.0, le=1000.0)
    """Upper bound of the accumulated boost of one domain."""

    decay: float = Field(0.5, gt=0.0, le=1.0)
    """When a boosted domain has recovered, its boost is multiplied by this (down to 1)."""


class BranchConfig(BaseModel):
    """Training the revision on the policy's own failed turns (tasks/branch.py): a training episode
    that ends failed after a failing non-final turn gives a derived task (the episode's transcript up
    to that turn's observation as the prompt, the same verifier, the remaining turns as its budget),
    queued and drawn as a group of its own. Only domains that implement `Domain.branch_at` derive
    (pyfunc_revise; docs/extending.md). Off by default (`share` 0)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    share: float = Field(0.0, ge=0.0, le=1.0)
    """Most of each draw's prompts that come from the queue of derived tasks (floor(share x prompts), when
    the queue holds that many); the rest are fresh. 0 turns branching off: no task is derived or queued."""

    max_queue: int = Field(64, ge=1, le=100_000)
    """Derived tasks the queue holds at most; a new one past it pushes out the oldest (counted)."""

    per_group: int = Field(1, ge=1, le=1024)
    """Derived tasks one group gives at most (its failed episodes in sample order, distinct prompts)."""

    baseline: Literal["group", "fresh"] = "group"
    """What a derived group's revisions are judged against. group: each other (GRPO's group mean),
    so a revision is rewarded for beating its siblings even when all of them do worse than starting
    over. fresh: what a fresh first attempt of the same task earned in the group the failure came
    from (its episodes' mean reward with every episode that did not end at its first turn counted
    0), so a revision gains only where it does better than trying again, and a group of revisions
    that all hand back the failure is pushed down (advantage reward - baseline, no std; docs/pipeline.md)."""


class TasksConfig(BaseModel):
    """Which domains the loop trains on, in what mix, and how difficulty is chosen."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    domains: dict[str, DomainSpec] = Field(default_factory=lambda: {n: DomainSpec() for n in BUILTIN_DOMAINS})
    """Domains by registered name (see `posttrain domains`), each with its weight and optional fixed difficulty."""

    seed: int = Field(0, ge=0, le=2**63 - 1)
    """Seed of the pool: which task indices are drawn and in what order."""

    temperature: float = Field(1.0, gt=0.0, le=1000.0)
    """Cross-domain temperature: shares are proportional to weight**(1/temperature); large values flatten towards uniform."""  # noqa: E501 (field docstring = its help text)

    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    """Difficulty tiers by online pass rate."""

    drift: DriftConfig = Field(default_factory=DriftConfig)
    """Guard that raises the weight of a domain regressing on held-out."""

    dedupe_window: int = Field(20_000, ge=0, le=10_000_000)
    """Number of recently drawn normalised prompts a new draw may not repeat (0 turns dedupe off)."""

    dedupe_attempts: int = Field(8, ge=1, le=1000)
    """Draw attempts per task before a duplicate is accepted (and counted in stats) for a domain with few distinct tasks."""  # noqa: E501 (field docstring = its help text)

    branch: BranchConfig = Field(default_factory=BranchConfig)
    """Derived tasks from the policy's own failed turns, drawn as groups of their own (off by default)."""

    eval_default_difficulty: int = Field(1, ge=1)
    """Eval difficulty of a domain with no fixed difficulty before the curriculum has moved (clipped to its levels)."""

    @model_validator(mode="after")
    def _check(self) -> TasksConfig:
        if not self.domains:
            raise ValueError("tasks.domains must name at least one domain")
        for key, spec in self.domains.items():
            if spec.source is not None and any(c in key for c in "*?["):
                raise ValueError(f"tasks.domains.{key}: a domain with a source needs a plain name, not a pattern")
        return self
