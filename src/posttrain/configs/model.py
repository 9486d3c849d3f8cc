"""The `model` config section: which model to post-train.

Invariant: torch-free; a path (or a real model's name) is only a string here, resolved and
checked where the model is loaded (model/arch.py, model/real.py).
"""

from __future__ import annotations

from typing import Literal

from posttrain.configs.section import Section


class ModelSection(Section):
    """Which model to post-train."""

    path: str | None = None
    """A local Hugging Face model directory, or a registered real model's name (`posttrain models
    list`, e.g. smollm2-135m-instruct: its checked cache, docs/models.md); None builds (or reuses)
    the embedded base."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model runs; auto picks CUDA when present."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of the policy."""
