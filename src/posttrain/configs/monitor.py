"""Typed configuration of the training monitor: signals, alarms, probes, loggers.

Invariant: a MonitorConfig that validates is runnable as is: every threshold
is bounded, every alarm names one action (log, lower_weight, stop, or for the
collapse alarms a countermeasure: raise_entropy, raise_diversity, countermeasures), unknown
keys are rejected and the model is frozen. Importing it imports no torch.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

_STRICT = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

Action = Literal["log", "lower_weight", "stop"]
CollapseAction = Literal["log", "lower_weight", "stop", "raise_entropy", "raise_diversity", "countermeasures"]


class AlarmRule(BaseModel):
    """One alarm: whether it is on and what it does when it fires."""

    model_config = _STRICT
    enabled: bool = True
    """Check this alarm."""
    action: Action = "log"
    """log: record it; lower_weight: multiply the domain's sampling weight by
    `alarms.weight_factor`; stop: end the run after this step (final eval, checkpoint, report)."""


class CollapseRule(AlarmRule):
    """Entropy or diversity collapse: the signal falls far below its own start."""

    action: CollapseAction = "log"
    """log, lower_weight or stop as for every alarm; or a countermeasure (monitor.countermeasures
    sets its steps and bounds): raise_entropy raises the domain's entropy-bonus coefficient
    (trainer.entropy_bonus), raise_diversity its diversity-reward weight
    (rollout.diversity_reward), countermeasures raises both."""

    ratio: float = Field(0.25, gt=0.0, lt=1.0)
    """Fires when the recent mean falls below ratio x the baseline mean."""
    solved_at: float = Field(0.9, gt=0.0, le=1.0)
    """A domain whose recent reward mean is at least this is solved: a peaked
    policy is expected there, so no collapse alarm."""


class HackingRule(AlarmRule):
    """Reward hacking: train reward rises while held-out accuracy does not."""

    rise: float = Field(0.15, gt=0.0, le=1.0)
    """Minimum rise of the recent train reward mean over its baseline."""
    stall: float = Field(0.02, ge=0.0, le=1.0)
    """Held-out accuracy gaining at most this much since the first evaluation counts as stalled."""


class LengthRule(AlarmRule):
    """Response-length explosion."""

    factor: float = Field(2.0, gt=1.0, le=1000.0)
    """Fires when the recent mean length exceeds factor x the baseline mean length ..."""
    truncated_share: float = Field(0.5, gt=0.0, le=1.0)
    """... or when the recent share of truncated completions exceeds this (having started below half of it)."""


class KLRule(AlarmRule):
    """KL acceleration: KL to the reference grows much faster than it did."""

    window: int = Field(5, ge=1, le=10_000)
    """KL measurements per window (three consecutive windows are compared); per-domain
    KL comes from a few rows each, so short windows alarm on noise."""
    factor: float = Field(3.0, gt=1.0, le=1000.0)
    """Fires when KL's growth over the last window exceeds factor x its growth over the window before ..."""
    min_growth: float = Field(1.0, gt=0.0)
    """... where a previous growth below this share of the KL level counts as this
    share (so a flat or noisy KL does not trip) ..."""
    min_kl: float = Field(0.05, ge=0.0)
    """... and only once the KL itself exceeds this."""


class RegressionRule(AlarmRule):
    """A domain regressing on held-out while the others improve."""

    tolerance: float = Field(0.05, ge=0.0, le=1.0)
    """A drop below the domain's best held-out accuracy by more than this is a
    regression; the others' mean must have gained more than this since the first evaluation."""

    z: float = Field(1.96, ge=0.0, le=10.0)
    """The drop must also exceed this many standard errors of the two accuracies (binomial,
    from the evaluations' item counts), so a small eval subset's noise does not alarm."""


class AuditRule(AlarmRule):
    """Top-reward rollouts that a domain's stricter check rejects."""

    max_fail_share: float = Field(0.2, ge=0.0, lt=1.0)
    """Fires when more than this share of the audited rollouts in the window fail the stricter check."""
    min_audited: int = Field(8, ge=1)
    """Audited rollouts needed in the window before the alarm can fire."""


class JudgeDriftRule(AlarmRule):
    """A judge's reward rising while the programmatic score of the same rollouts does not (issue 28)."""

    rise: float = Field(0.15, gt=0.0, le=1.0)
    """Fires when the judge's recent reward mean has risen over its baseline by at least this much more
    than the programmatic score (the judge's `checks.labels` verifier on the same rollouts) has."""


class JudgeBiasRule(AlarmRule):
    """A judge that fails a bias check at run start (calibration, position swap, length probe)."""


class AlarmsConfig(BaseModel):
    """Every alarm and its action."""

    model_config = _STRICT
    window: int = Field(5, ge=1, le=10_000)
    """Steps in a 'recent' window (signals are averaged over it)."""
    baseline_steps: int = Field(5, ge=1, le=10_000)
    """First steps of a domain that make up its baseline."""
    weight_factor: float = Field(0.5, gt=0.0, lt=1.0)
    """lower_weight multiplies the domain's sampling weight by this each time it fires."""
    entropy_collapse: CollapseRule = Field(default_factory=CollapseRule)
    """Token-level entropy collapse."""
    diversity_collapse: CollapseRule = Field(default_factory=CollapseRule)
    """Within-group diversity collapse (share of distinct answers)."""
    reward_hacking: HackingRule = Field(default_factory=HackingRule)
    """Train reward rising while held-out accuracy stalls or falls."""
    length_explosion: LengthRule = Field(default_factory=LengthRule)
    """Response length growing out of bounds."""
    kl_acceleration: KLRule = Field(default_factory=KLRule)
    """KL to the reference accelerating."""
    domain_regression: RegressionRule = Field(default_factory=RegressionRule)
    """A domain regressing while the others improve."""
    audit_failure: AuditRule = Field(default_factory=AuditRule)
    """Top-reward rollouts failing the domain's stricter check."""
    judge_drift: JudgeDriftRule = Field(default_factory=JudgeDriftRule)
    """A judge's reward rising while the programmatic score of the same rollouts stalls."""
    judge_bias: JudgeBiasRule = Field(default_factory=JudgeBiasRule)
    """A judge domain failing a run-start bias check (byo judge `checks`); `stop` refuses the run."""


class CountermeasuresConfig(BaseModel):
    """What a collapse alarm's countermeasure action does: each firing raises the domain's
    coefficient by a step, never above its bound. The coefficient the run uses is the larger of
    the configured one and the raised one."""

    model_config = _STRICT
    entropy_step: float = Field(0.01, gt=0.0, le=1.0)
    """raise_entropy: added to the domain's raised entropy-bonus coefficient (from 0) each firing."""
    entropy_max: float = Field(0.05, gt=0.0, le=1.0)
    """raise_entropy: the raised entropy-bonus coefficient never exceeds this."""
    diversity_step: float = Field(0.1, gt=0.0, le=1.0)
    """raise_diversity: added to the domain's raised diversity-reward weight (from 0) each firing."""
    diversity_max: float = Field(0.3, gt=0.0, le=1.0)
    """raise_diversity: the raised diversity-reward weight never exceeds this."""


class ProbeConfig(BaseModel):
    """Reward-hacking probes: cheat outputs scored by the live verifier."""

    model_config = _STRICT
    enabled: bool = True
    """Probe every domain with declared cheats at start."""
    every_steps: int = Field(50, ge=0)
    """Probe again every N steps (0: only at start)."""
    tasks: int = Field(4, ge=1, le=1000)
    """Train tasks per domain whose cheats are scored."""
    action: Literal["exclude", "stop"] = "exclude"
    """exclude: refuse to train on the domain (never drawn again; the run
    stops when no domain is left); stop: refuse to start / stop the run."""


class AuditConfig(BaseModel):
    """Audit of top-reward rollouts by a domain's stricter check, where it has one."""

    model_config = _STRICT
    enabled: bool = True
    """Audit rollouts of domains that declare a stricter check."""
    per_step: int = Field(8, ge=1, le=10_000)
    """Top-reward rollouts audited per domain per step."""


class KLConfig(BaseModel):
    """KL of the policy to the initial model, measured on sampled tokens."""

    model_config = _STRICT
    every_steps: int = Field(10, ge=0)
    """Measure every N steps (0: off; the trainer's KL is used when it has a reference model)."""
    rows: int = Field(32, ge=1, le=100_000)
    """Sampled completions per measurement (spread over domains)."""


class DiversityConfig(BaseModel):
    """Within-group diversity measures."""

    model_config = _STRICT
    n: int = Field(2, ge=1, le=8)
    """distinct-n uses n-grams of this many characters."""
    max_chars: int = Field(64, ge=4, le=100_000)
    """Completions are cut to this many characters for the pairwise edit distance."""


class LoggersConfig(BaseModel):
    """Where signals go besides metrics.jsonl (always written)."""

    model_config = _STRICT
    tensorboard: bool = False
    """Also write TensorBoard event files to RUN_DIR/tensorboard (needs tensorboardX)."""
    wandb: bool = False
    """Also log to Weights & Biases in offline mode, under RUN_DIR/wandb (needs wandb)."""
    wandb_project: str = "posttrain"
    """W&B project name."""


class MonitorConfig(BaseModel):
    """The training monitor."""

    model_config = _STRICT
    enabled: bool = True
    """Compute signals, check alarms and run probes during training."""
    alarms: AlarmsConfig = Field(default_factory=AlarmsConfig)
    """Alarms and their actions."""
    probes: ProbeConfig = Field(default_factory=ProbeConfig)
    """Reward-hacking probes."""
    audit: AuditConfig = Field(default_factory=AuditConfig)
    """Stricter-check audit of top-reward rollouts."""
    countermeasures: CountermeasuresConfig = Field(default_factory=CountermeasuresConfig)
    """Steps and bounds of the collapse alarms' countermeasure actions."""
    kl: KLConfig = Field(default_factory=KLConfig)
    """KL to the initial model."""
    diversity: DiversityConfig = Field(default_factory=DiversityConfig)
    """Diversity measures."""
    loggers: LoggersConfig = Field(default_factory=LoggersConfig)
    """Optional TensorBoard and W&B loggers."""
    report: bool = True
    """Write RUN_DIR/report.html during `posttrain train` (after each evaluation and every
    `report_every_steps` steps) and at its end."""
    report_every_steps: int = Field(50, ge=0)
    """Also rewrite the report every this many steps between evaluations (0: after evaluations
    and at the end only)."""
