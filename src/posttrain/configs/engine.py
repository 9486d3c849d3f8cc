"""The `engine` config section: which inference engine the loop samples with.

Invariant: torch-free; a config that validates names a runnable engine (the
openai engine always has an http(s) URL), unknown keys are rejected.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

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

    @model_validator(mode="after")
    def _url_for_openai(self) -> EngineConfig:
        if self.type == "openai" and not (self.url or "").startswith(("http://", "https://")):
            raise ValueError(
                f"engine.url must be an http:// or https:// URL when engine.type is openai, got {self.url!r}"
            )
        return self
