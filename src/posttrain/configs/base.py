"""The `base` config section: how the embedded base model is built (`posttrain base build`).

Invariant: torch-free; the build is a pure function of this config (seed included), and
`fingerprint()` names it, so one config maps to one cached model directory.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, ConfigDict, Field


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
    pretraining text is short, so long prompts run but are far outside what it learned)."""

    def fingerprint(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]
