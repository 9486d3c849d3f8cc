"""The `rollout` config section: how rollouts are sampled each step.

Invariant: torch-free; every field is bounded.
"""

from __future__ import annotations

from pydantic import Field

from posttrain.configs.section import Section


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
    """Drop groups whose rewards are all equal (they carry no signal) and count them."""
