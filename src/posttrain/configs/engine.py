"""The `engine` config section: which inference engine the loop samples with.

Invariant: torch-free; a config that validates names a runnable engine (the
openai engine always has an http(s) URL), unknown keys are rejected.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_STRICT = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class EngineConfig(BaseModel):
    """Inference for rollouts and eval: in process (hf) or a remote OpenAI-compatible server."""

    model_config = _STRICT
    type: Literal["hf", "openai"] = "hf"
    """hf: transformers in this process, sharing the trained module. openai: a server
    (`posttrain serve`, vLLM with weight-update support) that gets new weights over
    HTTP (/v1/update_weights) after each optimizer step."""
    url: str | None = None
    """With openai: the server's base URL, e.g. http://127.0.0.1:8000/v1."""
    served_model: str = "posttrain"
    """With openai: the model name sent in each request."""
    api_key: str = "none"
    """With openai: bearer token for the server."""
    admin_token_file: str | None = None
    """With openai: file holding the server's admin token, sent as the bearer token of
    weight updates (/v1/update_weights); None: the POSTTRAIN_ADMIN_TOKEN environment
    variable, and without it `api_key`."""
    timeout_s: float = Field(120.0, gt=0.0, le=86_400.0)
    """With openai: seconds before one HTTP request is an infra error."""
    concurrency: int = Field(16, ge=1, le=4096)
    """With openai: concurrent HTTP requests."""
    sync_dir: str | None = None
    """With openai: folder the trainer writes each weight version to and the server reads
    from (shared disk across hosts); None: <run dir>/weights."""
    keep_versions: int = Field(2, ge=1, le=1000)
    """With openai: weight versions kept in sync_dir (older ones are deleted)."""

    verify_sync: Literal["auto", "on", "off"] = "auto"
    """Check after every weight push that the engine serves the trainer's policy (engine/probe.py):
    one fixed generation request, whose per-token log-probs must equal the trainer's own forward
    within verify_tolerance, else one re-push, then a SyncVerificationError stops the run.
    auto (the default): on for a remote engine (openai), off in process (hf), where the engine
    holds the trainer's own module and no push can be lost; on: every engine; off: never."""
    verify_tolerance: float | None = Field(None, gt=0.0, le=10.0)
    """Largest |engine log-prob - trainer log-prob| over the probe's tokens that passes; None: by
    the trainer's dtype: 1e-4 for float32 (vLLM matched transformers to 3e-6 on CPU), 5e-2 for
    bfloat16 (float32 weights under trainer.precision bf16_autocast included), 1e-2 for float16."""
    verify_prompt_tokens: int = Field(320, ge=1, le=1 << 20)
    """At least this many prompt tokens in the probe: several KV-cache blocks (vLLM caches a
    prefix in whole blocks, 16 tokens by default on a GPU, 128 on its CPU build), so a prefix
    cache not reset after a push shows. It must leave verify_tokens of room in the model."""
    verify_tokens: int = Field(8, ge=1, le=4096)
    """Tokens the probe generates (fewer when the engine ends the sequence first)."""

    @field_validator("verify_sync", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: object) -> object:
        """YAML 1.1 reads a bare on/off as true/false: take them as "on"/"off"."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _url_for_openai(self) -> EngineConfig:
        if self.type == "openai" and not (self.url or "").startswith(("http://", "https://")):
            raise ValueError(
                f"engine.url must be an http:// or https:// URL when engine.type is openai, got {self.url!r}"
            )
        return self
