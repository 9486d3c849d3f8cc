"""The `rollout` config section: how rollouts are sampled each step.

Invariant: torch-free; every field is bounded.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from posttrain.configs.section import Section


class DiversityRewardConfig(BaseModel):
    """A diversity reward within a group, added to the verifier's reward for training only (the
    trace keeps the verifier's reward and records the bonus apart, as the part `diversity_bonus`).
    A rollout's bonus is weight x its novelty among its group-mates, capped below half the gap to
    the next higher verifier reward in its group: a diverse answer never overtakes one the
    verifier scored higher (a diverse wrong answer never beats a correct one)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
    weight: float = Field(0.0, ge=0.0, le=1.0)
    """Weight for every domain not named in `domains` (0: no diversity reward). A domain's weight
    is the larger of this configured one and the one the monitor raised it to."""
    domains: dict[str, float] = Field(default_factory=dict)
    """Per-domain weight, overriding `weight` for the domains named (each in [0, 1])."""
    novelty: Literal["answer", "ngram"] = "answer"
    """answer: 1 - the share of group-mates whose extracted final answer equals this one's;
    ngram: the share of this completion's character n-grams (monitor.diversity.n) that no
    group-mate's completion holds."""

    @field_validator("domains")
    @classmethod
    def _bounded(cls, weights: dict[str, float]) -> dict[str, float]:
        for name, value in weights.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"diversity_reward.domains.{name} must be in [0, 1], got {value}")
        return weights


class RolloutConfig(Section):
    """How rollouts are sampled each step."""

    prompts_per_step: int = Field(32, ge=1, le=4096)
    """Tasks drawn per training step."""
    group_size: int = Field(8, ge=2, le=256)
    """Samples per task (G): advantages are relative within a group."""
    temperature: float = Field(1.0, gt=0.0, le=5.0)
    """Sampling temperature of rollouts."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass."""
    max_tokens: int | None = Field(None, ge=1, le=32768)
    """A cap over every domain's tokens per turn (None: no cap). Each domain generates with its
    own budget (declared, or `tasks.domains.<name>.max_tokens`), in batches of equal budget; a
    completion that hits it finishes with reason `length`."""
    dynamic_sampling: bool = True
    """Drop groups whose rewards are all equal (they carry no signal) and count them. The rewards
    compared are the training rewards (the verifier's plus any diversity bonus)."""
    diversity_reward: DiversityRewardConfig = Field(default_factory=DiversityRewardConfig)
    """Diversity reward within a group, global and per domain (off by default)."""
