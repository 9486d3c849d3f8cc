"""The `eval` config section: held-out sets, intervals, probes, contamination checks.

Invariant: torch-free; every k of pass@k is at most the samples drawn.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from posttrain.configs.section import Section


class EvalConfig(Section):
    """Held-out evaluation: distinct versioned held-out sets, intervals, probes, contamination checks."""

    tasks_per_domain: int = Field(100, ge=1, le=100_000)
    """Distinct held-out tasks per domain in the core set (fewer when the domain's eval split
    holds fewer; the table then says so)."""
    every_steps: int = Field(25, ge=0)
    """Evaluate the fixed subset (and a rotation slice) every N training steps, as well as the
    full set before and after (0: before and after only). The drift guard and the held-out
    alarms act on these evaluations."""
    subset_tasks: int = Field(50, ge=1, le=100_000)
    """The fixed subset evaluated during training: the first N items of each core set (every
    curve point, before and after included, is measured on it, so points compare)."""
    rotation_tasks: int = Field(16, ge=0, le=100_000)
    """Fresh distinct held-out items per domain drawn anew at each evaluation during training
    (none equal to a core item), reported apart from the core (0: off)."""
    max_tokens: int | None = Field(None, ge=1, le=32768)
    """A cap over every domain's tokens at eval (None: no cap); each domain is evaluated with the
    budget it is trained with (declared, or `tasks.domains.<name>.max_tokens`)."""
    batch_size: int = Field(256, ge=1, le=65536)
    """Prompts per generation call at eval."""
    seed: int = Field(0, ge=0)
    """Seed of the held-out sets (0: indices from 0, as before) and of sampled metrics."""
    samples: int = Field(8, ge=0, le=1024)
    """Sampled completions per core item, before and after training, for pass@k and maj@k
    (0: greedy accuracy only)."""
    temperature: float = Field(1.0, gt=0.0, le=5.0)
    """Sampling temperature of pass@k / maj@k."""
    k: tuple[int, ...] = (1, 4, 8)
    """The k of pass@k and maj@k (unbiased estimators); each at most `samples`."""
    above_tasks: int = Field(50, ge=0, le=100_000)
    """Generalisation probe: distinct held-out tasks one level above each trained domain's level
    (where it has one) and per transfer family (0: off)."""
    transfer_domains: dict[str, int] = Field(default_factory=dict)
    """Generalisation probe: families never trained on, each with its level (e.g. {mul: 1}),
    evaluated before and after and reported apart."""
    contamination: bool = True
    """At run start, report the n-gram overlap of the held-out prompts with the run's first
    `contamination_train_tasks` training draws."""
    contamination_train_tasks: int = Field(2000, ge=1, le=10_000_000)
    """Training draws compared with the held-out set."""
    ngram: int = Field(8, ge=1, le=64)
    """n of the contamination n-grams (a prompt shorter than n counts as one n-gram)."""
    exposure: bool = True
    """At run start, check the base model's exposure to the held-out answers (log-likelihood
    margin of gold over wrong answers, held-out against matched control items)."""
    exposure_tasks: int = Field(64, ge=2, le=100_000)
    """Held-out items (and as many control items) per domain in the exposure check."""
    before_from: str | None = None
    """A finished run's directory (a `posttrain sft` run's, or a train run's) whose final table is
    this run's "before" instead of evaluating the starting weights again: `model.path` must be
    that run's newest checkpoint (the weights its final table measured), and its held-out set
    (heldout version) and evaluation options must equal this run's; otherwise a ConfigError
    names what differs, before any step. None (the default): evaluate before training."""
    exposure_threshold: float = Field(1.0, gt=0.0, le=1000.0)
    """Nats per item by which the held-out margin must exceed the control margin (interval
    excluding 0) for a domain to be flagged as memorised."""

    @field_validator("k")
    @classmethod
    def _ks(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or any(k < 1 for k in v):
            raise ValueError("eval.k must list ks >= 1")
        return tuple(sorted(set(v)))

    @model_validator(mode="after")
    def _k_within_samples(self) -> EvalConfig:
        if self.samples and max(self.k) > self.samples:
            raise ValueError(f"eval.k: every k must be at most eval.samples={self.samples}, got {list(self.k)}")
        return self
