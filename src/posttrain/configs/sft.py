"""The `sft` config section: supervised fine-tuning on demonstrations (`posttrain sft`).

Invariant: torch-free; a data path is only a string here, read (and every bad row reported
with its line) where the demonstrations are loaded (sft/data.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from posttrain.configs.section import Section


class SftSection(Section):
    """Supervised fine-tuning on chat demonstrations; the loss is on assistant tokens only."""

    data: str | None = None
    """Demonstrations: a JSONL, CSV or Parquet file, or a directory saved by `datasets`
    (`save_to_disk`), one demonstration per row, its chat in the `messages_field` column
    (a list of {role, content}); a relative path is taken from the current directory."""
    format: Literal["auto", "jsonl", "csv", "parquet", "datasets"] = "auto"
    """File format of `data`; auto picks it from the suffix (a directory is a `datasets` directory)."""
    messages_field: str = Field("messages", min_length=1)
    """The column of a row that holds its chat messages."""
    epochs: int = Field(1, ge=1, le=100_000)
    """Passes over the demonstrations (each in a new seeded order of length batches)."""
    max_steps: int | None = Field(None, ge=1, le=10_000_000)
    """Stop after this many optimizer steps even inside an epoch (None: run every epoch)."""
    lr: float = Field(1e-3, gt=0.0, le=1.0)
    """AdamW learning rate (after the linear warm-up)."""
    warmup_steps: int = Field(0, ge=0, le=10_000_000)
    """Steps of linear learning-rate warm-up from lr/warmup_steps to lr."""
    weight_decay: float = Field(0.0, ge=0.0, le=10.0)
    """AdamW weight decay."""
    grad_clip: float = Field(1.0, gt=0.0, le=1e6)
    """Clip the gradient's global norm to this before each step."""
    batch_tokens: int = Field(2048, ge=1, le=10_000_000)
    """Batching by length: demonstrations of similar length go together, and a batch holds at most
    this many tokens counting its padding (its longest row times its rows; a row longer than this
    is a batch alone)."""
    max_length: int = Field(512, ge=2, le=1_000_000)
    """The most tokens a rendered demonstration may have (it must also fit the model's positions);
    a longer one is rejected with its line and the rest train."""
    strict: bool = False
    """Stop with an error listing every bad row instead of training on the good ones."""
    checkpoint_every: int = Field(0, ge=0, le=10_000_000)
    """Save a checkpoint every N steps besides the final one (0: only the final one)."""
    keep_checkpoints: int | None = Field(None, ge=1, le=100_000)
    """Keep only the newest N checkpoints (None: keep all)."""
    evaluate: bool = True
    """Evaluate the held-out sets of `tasks.domains` (the same machinery and settings as `posttrain
    train`, section `eval`) before and after fine-tuning."""

    @field_validator("data")
    @classmethod
    def _not_blank(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("sft.data is blank: give the path of a demonstrations file")
        return v
