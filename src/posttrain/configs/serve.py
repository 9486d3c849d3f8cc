"""Typed configuration of the server, its tiers, batching and canary policy.

Invariant: every knob has a bound and a docstring; a bad value raises
ConfigError naming the dotted field (see `load_serve_config`).
"""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from posttrain.errors import ConfigError

_STRICT = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class BatchConfig(BaseModel):
    """Dynamic batching of one tier."""

    model_config = _STRICT

    max_batch: int = Field(16, ge=1, le=1024)
    """Most requests decoded together in one engine call."""

    max_wait_ms: float = Field(4.0, ge=0.0, le=1000.0)
    """How long the first queued request waits for others to join its batch."""


class FastTierConfig(BaseModel):
    """The fast tier: the same weights with inference-side speed-ups."""

    model_config = _STRICT

    mode: Literal["lossless", "int8"] = "lossless"
    """lossless: the float weights verify every token (greedy output equals the
    standard tier). int8: int8 weights decode (lossy); served only when the
    release quality gate passed, else the version falls back to lossless."""

    ngram: bool = True
    """Draft by suffix matching, no extra model (serve/spec.py `SuffixDrafter`, the rollouts'
    drafter of engine/drafter.py): what followed the longest match (2 to `ngram_max` tokens) of
    the sequence's last tokens in its prompt, its own output, or a past completion of the same
    prompt (`past_prompts`)."""

    ngram_tokens: int = Field(10, ge=1, le=32)
    """Most tokens of one model-free draft. The length adapts per sequence: it starts at 4 (or
    this, if less), doubles after a draft accepted in full, halves after a rejection. (Before
    the suffix drafter it was a fixed length; a value set for that is read as this upper bound.)"""

    ngram_max: int = Field(8, ge=2, le=64)
    """Longest suffix (tokens) the model-free drafter matches."""

    past_prompts: int = Field(256, ge=0, le=100_000)
    """Prompts whose latest completions the model-free drafter keeps (least recently stored
    dropped first) to draft from when the same prompt comes again; 0: none (where response time
    must not reveal that a prompt was answered before). Kept until the next weight update."""

    past_per_prompt: int = Field(4, ge=1, le=64)
    """Completions kept per prompt (the latest)."""

    past_tokens: int = Field(1024, ge=1, le=1_000_000)
    """Each kept completion's first tokens (the rest is not kept)."""

    target: Literal["hf", "lean"] = "lean"
    """What verifies drafts: `lean`, the same float weights on the lean decode path
    (logits equal the transformers module's to float32 rounding; faster); `hf`, the
    transformers module itself (the standard tier's own per-token computation)."""

    draft_model: Literal["auto", "lean", "lean-int8", "int8", "none"] = "auto"
    """Draft model used when the model-free drafter finds nothing: `lean`, a copy of the
    same float weights on the lean decode path (serve.lean); `lean-int8`, the same
    with per-channel int8 weights; `int8`, an int8 copy through transformers; `none`;
    `auto`: lean-int8 when one of its steps costs under `auto_draft_cost` of a
    target step (measured when the tier is built), else none."""

    model_draft_after: int = Field(4, ge=0, le=1_000_000)
    """Generated tokens before the draft model starts drafting (its prompt prefill
    costs more than it saves on short answers); the model-free drafter drafts from the start."""

    auto_draft_cost: float = Field(0.25, gt=0.0, le=1.0)
    """Largest draft/target step-cost ratio at which `auto` drafts with lean-int8. Measured with the
    suffix drafter on (bench/RESULTS.md "The fast tier on the real model"): at 0.30 (the 19M preset)
    and 0.47 (SmolLM2-135M-Instruct after RL) lean-int8 drafts cost more than they saved, so it is off
    at both (it was 0.5 before)."""

    draft_model_tokens: int = Field(5, ge=1, le=16)
    """Most tokens of one draft of the draft model (adaptive per sequence as `ngram_tokens`)."""

    head: bool = False
    """Opt-in (measured net-negative on the embedded demo: 0.66-0.76x, bench/RESULTS.md). Draft
    first with the served model folder's co-trained draft head (`draft_head.pt`, written by
    `posttrain train` with trainer.draft_head on and kept by export and release) when it has one,
    up to the head's depth, from the lean target's hidden state (target `lean` only); false: never."""

    batch: BatchConfig = BatchConfig(max_batch=1, max_wait_ms=0.0)
    """Latency first: one request at a time, no waiting."""

    overflow_queue: int = Field(2, ge=0, le=1_000_000)
    """When this many requests already wait for the fast tier, a new fast request is
    served by the batched standard tier instead (same weights and the same output;
    the response reports `standard`); 0 disables."""


class CanaryConfig(BaseModel):
    """Gradual rollout of a new version and automatic rollback."""

    model_config = _STRICT

    share: float = Field(0.1, ge=0.0, le=1.0)
    """Fraction of routed traffic sent to the canary version."""

    check_interval_s: float = Field(5.0, gt=0.0, le=3600.0)
    """Seconds between canary health checks."""

    min_requests: int = Field(3, ge=1, le=100_000)
    """Canary requests needed in a window before its error rate and latency are judged."""

    max_error_rate_delta: float = Field(0.05, ge=0.0, le=1.0)
    """Canary error rate above stable's by more than this is a regression."""

    max_latency_ratio: float = Field(3.0, ge=1.0, le=1000.0)
    """Canary mean latency per output token above stable's times this is a regression."""

    max_quality_drop: float = Field(0.05, ge=0.0, le=1.0)
    """Canary probe accuracy below stable's by more than this is a regression."""

    bad_checks_to_rollback: int = Field(2, ge=1, le=100)
    """Consecutive regressed checks that roll the canary back."""

    probe_domains: tuple[str, ...] = ("reverse", "sort")
    """Domains of the held-out quality probe (empty: no probe)."""

    probe_tasks: int = Field(8, ge=0, le=1000)
    """Eval tasks per probe domain per check."""


class LimitsConfig(BaseModel):
    """Bounds on what one client request may make the server hold or compute.

    Each is checked before the work it bounds: the body size on the stream, the
    nesting depth before the JSON parser runs, prompt characters before the
    tokenizer runs, prompt tokens after it."""

    model_config = _STRICT

    max_body_bytes: int = Field(1 << 20, ge=1024, le=1 << 30)
    """Largest request body in bytes, checked against Content-Length and against the
    bytes actually received, before the whole body is held (413 above it)."""

    body_timeout_s: float = Field(30.0, gt=0.0, le=3600.0)
    """Seconds a client may take to send its whole body (408 after it). A generation request
    takes one of the `max_inflight` places only once its whole body has arrived, so a slow
    sender holds no place, only its own connection."""

    header_timeout_s: float = Field(10.0, gt=0.0, le=3600.0)
    """Seconds a request's line and headers may take to arrive, from the connection's opening
    (or the request's first byte on a kept-alive connection); the connection is closed after."""

    max_connections: int = Field(512, ge=8, le=1_000_000)
    """Most connections the server holds open (lowered to the process's file-descriptor limit
    less 64). One more closes the oldest stalled connection (headers or body still arriving, or
    idle) of the client with the most connections; a connection serving an admitted request is
    never closed for it."""

    max_connections_per_client: int = Field(32, ge=1, le=1_000_000)
    """Most connections one client address holds open; one more closes that client's oldest
    stalled connection (or, when none is stalled, is closed itself)."""

    max_json_depth: int = Field(32, ge=2, le=1000)
    """Deepest nesting of JSON arrays and objects in a request body, checked before it
    is parsed (400 above it)."""

    max_prompt_chars: int = Field(131_072, ge=1, le=1 << 30)
    """Most characters of prompt text in one request (every message's content, or
    every completions prompt, summed), checked before tokenizing (400 above it)."""

    max_prompt_tokens: int = Field(8192, ge=1, le=1 << 24)
    """Most tokens in one prompt, after tokenizing (or as given as token ids); the
    model's own position limit applies as well (400 above it)."""

    max_messages: int = Field(256, ge=1, le=1_000_000)
    """Most chat messages (and content parts) in one chat request (400 above it)."""

    max_images: int = Field(8, ge=0, le=1024)
    """Most `image_url` content parts in one chat request (400 above it; 0 refuses images)."""

    max_image_bytes: int = Field(4 << 20, ge=64, le=4 << 20)
    """Largest image, in PNG bytes once decoded from its data URL: the base64 text's length is
    checked against it before any of it is decoded, the decoded bytes after (400 above it). At
    most 4 MiB, the typed Image's own bound (types.MAX_IMAGE_BYTES); `max_body_bytes` bounds
    the whole request first."""

    max_image_pixels: int = Field(2048 * 2048, ge=1, le=2048 * 2048)
    """Most pixels (width x height) of one image, read from its PNG header before the image
    is decoded (400 above it). At most 2048 x 2048, the typed Image's own bound
    (types.MAX_IMAGE_PIXELS)."""

    max_prompts: int = Field(32, ge=1, le=100_000)
    """Most prompts in one completions request (400 above it)."""

    max_n: int = Field(16, ge=1, le=64)
    """Largest `n` (choices per prompt) a request may ask for (400 above it)."""

    max_choices: int = Field(64, ge=1, le=100_000)
    """Most choices one request may ask for: `n` times its number of prompts (400 above it)."""

    max_inflight: int = Field(64, ge=1, le=100_000)
    """Generation requests handled at once, from the first body byte to the last
    response byte; one more is refused at once with 429, before its body is read."""

    work_threads: int = Field(2, ge=1, le=64)
    """Worker threads that parse, validate and tokenize requests off the event loop."""


ADMIN_TOKEN_ENV = "POSTTRAIN_ADMIN_TOKEN"
"""Environment variable that holds the admin bearer token (server and clients)."""


class AdminConfig(BaseModel):
    """Who may call the weight-update and admin endpoints (/v1/update_weights, /admin/*)."""

    model_config = _STRICT

    auth: bool = True
    """Require the admin bearer token; with no token configured the endpoints are then
    refused. False (`posttrain serve --insecure-admin`) drops the token check only."""

    token_file: str | None = None
    """File whose content (surrounding whitespace stripped) is the admin token; None:
    the POSTTRAIN_ADMIN_TOKEN environment variable."""

    allow_clients: tuple[str, ...] = ("127.0.0.0/8", "::1/128")
    """Client addresses or networks (CIDR) allowed on admin endpoints; others get 403
    whatever token they send. Default: loopback only."""

    @field_validator("allow_clients")
    @classmethod
    def _networks(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for net in v:
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise ValueError(f"{net!r} is not an IP address or CIDR network") from None
        return v


def admin_token(token_file: str | None) -> str | None:
    """The admin token from `token_file`, else from POSTTRAIN_ADMIN_TOKEN; None when neither
    is set. ConfigError for a token file that cannot be read or is empty."""
    if token_file is None:
        return os.environ.get(ADMIN_TOKEN_ENV, "").strip() or None
    try:
        token = Path(token_file).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"admin token file {token_file!r}: {exc}") from None
    if not token:
        raise ConfigError(f"admin token file {token_file!r} is empty")
    return token


class ServeConfig(BaseModel):
    """`posttrain serve`: what to serve and how."""

    model_config = _STRICT

    registry: str | None = None
    """Model registry directory (from `posttrain release`); serves its stable and canary versions."""

    model: str | None = None
    """A single Hugging Face model directory to serve as version v0 (no registry)."""

    policy: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
    """A rule-based chat "model" instead of weights: `package.module:function` (the current directory
    is importable), called with a request's messages as a list of {role, content} and returning the
    reply text. Serves /v1/chat/completions (not streamed), /v1/models and /health only; for
    testing clients and judges (docs/serving.md, "A rule-based policy")."""

    host: str = "127.0.0.1"
    """Address to bind."""

    port: int = Field(8000, ge=0, le=65535)
    """TCP port (0: any free port)."""

    torch_threads: int = Field(1, ge=1, le=256)
    """Intra-op threads per torch call; each tier runs in its own worker thread."""

    max_tokens_limit: int = Field(512, ge=1, le=1 << 20)
    """Largest max_tokens a request may ask for."""

    served_name: str = "posttrain"
    """Model name clients use; suffixes `:fast`/`:standard` pick a tier, `@vN` a version."""

    standard_batch: BatchConfig = BatchConfig()
    """Throughput first: batch concurrent requests."""

    fast: FastTierConfig = FastTierConfig()
    """The fast tier."""

    canary: CanaryConfig = CanaryConfig()
    """Canary rollout and rollback policy."""

    limits: LimitsConfig = LimitsConfig()
    """Bounds on request size and on request work in flight."""

    admin: AdminConfig = AdminConfig()
    """Credentials and client addresses for the weight-update and admin endpoints."""


def load_serve_config(data: dict[str, Any]) -> ServeConfig:
    """A ServeConfig, or ConfigError naming the first bad field."""
    try:
        return ServeConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"serve config: {field}: {err['msg']}") from None
