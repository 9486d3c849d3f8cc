"""The `base` config section: how the embedded base model is built (`posttrain base build`).

Invariant: torch-free; the build is a pure function of this config (seed included), and
`fingerprint()` names it, so one config maps to one cached model directory. A field added
later enters the fingerprint only when it differs from its default (`LATER_FIELDS`), so the
bases built before it keep their names.
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class RopeScaling(BaseModel):
    """RoPE scaling over the trained base (transformers' `rope_parameters`): positions up to
    `base.max_positions` are mapped onto the `base.max_positions / factor` positions the base
    learned. Pretraining never sees it: a base with scaling has the weights of the same base
    without it (`posttrain base build` reuses them, model/pretrain.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    type: Literal["linear", "dynamic", "yarn"]
    """linear: position p is read as p / factor (position interpolation); dynamic: NTK-aware,
    transformers raises the RoPE base only once a sequence passes the learned length, rescaling
    with the sequence's length (inference only: a KV cache holds keys rotated at the older
    scale, so the engine's log-probs and the trainer's differ past that length); yarn:
    interpolates the low frequencies, keeps the high ones, and scales attention (YaRN)."""
    factor: float = Field(gt=1.0, le=1024.0)
    """How many times longer than the learned positions `base.max_positions` is (> 1)."""
    original_max_positions: int | None = Field(None, ge=16, le=1_000_000)
    """The positions the base learned: `base.max_positions / factor` when unset; when set, it
    must equal that (transformers' and vLLM's `original_max_position_embeddings`)."""


LATER_FIELDS = {"rope_theta": 10000.0, "rope_scaling": None}
"""Fields added after bases were cached, with their defaults: at the default they stay out of
`fingerprint()`, so a default base keeps its cache key (the demo's base is not rebuilt)."""


class BaseConfig(BaseModel):
    """How the embedded base model is built (`posttrain base build`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: str = "tiny"
    """Architecture preset: micro (22k params), tiny (0.8M), small (4.8M), medium (19M)."""
    domains: dict[str, int] = Field(default_factory=lambda: {"add": 1, "sub": 1, "mul": 1, "reverse": 1, "sort": 1})
    """Built-in domains to pretrain on, each with the highest difficulty level of its text
    (levels 1..L are drawn uniformly)."""
    steps: int = Field(2000, ge=1, le=1_000_000)
    """Optimizer steps of pretraining."""
    batch_size: int = Field(64, ge=1, le=4096)
    """Examples per step."""
    lr: float = Field(3e-3, gt=0, le=1.0)
    """Peak learning rate (linear warm-up, cosine decay)."""
    buggy_fraction: float = Field(0.6, ge=0.0, le=1.0)
    """Share of examples answered by the domain's buggy solver instead of the gold answer."""
    seed: int = 0
    """Seed of weights, data and order: one seed, one model."""
    threads: int = Field(2, ge=1, le=256)
    """torch threads during the build."""
    max_positions: int = Field(8192, ge=64, le=1_000_000)
    """Longest prompt plus completion the model accepts (RoPE: no parameters depend on it;
    pretraining text is short, so long prompts run but are far outside what it learned;
    `rope_scaling` maps them onto fewer positions)."""
    rope_theta: float = Field(10000.0, gt=1.0, le=1e9)
    """RoPE base (wavelength) of the position rotations, used in pretraining: another value
    is another model (rebuilt). transformers' and Qwen2's default 10,000."""
    rope_scaling: RopeScaling | None = None
    """RoPE scaling written into the built model's config (docs/models.md "Longer context"):
    none by default; e.g. {type: linear, factor: 8} reads 8,192 positions as 1,024. It reuses
    the weights of the same base without scaling (no pretraining of its own)."""

    @model_validator(mode="after")
    def _whole_learned_length(self) -> BaseConfig:
        if self.rope_scaling is not None:
            self.learned_positions()  # raises, naming the field, when they do not fit
        return self

    def learned_positions(self) -> int:
        """The positions the base learned: `max_positions`, or with `rope_scaling`
        `max_positions / factor` (a whole number, `original_max_positions` when set)."""
        scaling = self.rope_scaling
        if scaling is None:
            return self.max_positions
        learned = self.max_positions / scaling.factor
        if scaling.original_max_positions is not None and scaling.original_max_positions != learned:
            raise ValueError(
                f"base.rope_scaling.original_max_positions must be base.max_positions / base.rope_scaling.factor "
                f"({self.max_positions} / {scaling.factor:g} = {learned:g}), got {scaling.original_max_positions}"
            )
        if learned != int(learned) or learned < 16:
            raise ValueError(
                f"base.rope_scaling.factor must divide base.max_positions ({self.max_positions}) into a whole "
                f"number of learned positions (at least 16), got factor {scaling.factor:g} ({learned:g} positions)"
            )
        return int(learned)

    def unscaled(self) -> BaseConfig:
        """This config without `rope_scaling`: the base whose weights a scaled base reuses."""
        return self.model_copy(update={"rope_scaling": None})

    def fingerprint(self) -> str:
        at_default = {name for name, default in LATER_FIELDS.items() if getattr(self, name) == default}
        return hashlib.sha256(self.model_dump_json(exclude=at_default).encode()).hexdigest()[:12]
