"""The `engine` config section: which inference engine the loop samples with.

Invariant: torch-free; a config that validates names a runnable engine (the
openai engine always has an http(s) URL; the vllm engine either an http(s) URL
to attach to or none, when posttrain starts the server), unknown keys are
rejected. `kind` is the field's name; `type` is accepted as its old spelling.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

_STRICT = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class VLLMConfig(BaseModel):
    """The vllm engine's server: started and owned by posttrain (no `engine.url`) or attached to."""

    model_config = _STRICT
    python: str | None = None
    """Interpreter of the virtual environment vLLM is installed in (`make vllm-venv`); None:
    the POSTTRAIN_VLLM_PYTHON environment variable, else <repo>/.venv-vllm/bin/python."""
    startup_timeout_s: float = Field(300.0, gt=0.0, le=3600.0)
    """Seconds a started server has to answer /health before it is an infra error."""
    memory_fraction: float = Field(0.1, gt=0.0, le=1.0)
    """vLLM's --gpu-memory-utilization: the share of GPU memory the server may take; on a CPU,
    the share of the host's RAM it reserves (the default 0.92 of vLLM refuses to start on a
    shared host)."""
    cpu_kv_cache_gib: int = Field(1, ge=1, le=1024)
    """On a CPU: GiB of KV cache (VLLM_CPU_KVCACHE_SPACE)."""
    dtype: str = "auto"
    """Weights' dtype in the server (--dtype); auto: float32 on a CPU, vLLM's own choice on a GPU
    (`--dtype auto`, from the model config's dtype; set bfloat16 to train and serve in bf16)."""
    max_model_len: int | None = Field(None, ge=16, le=1 << 20)
    """Longest prompt plus completion the server takes (--max-model-len); None: the model's."""
    max_restarts: int = Field(5, ge=0, le=1000)
    """Restarts of a started server that died or hung, over the run; past it a dead server is
    a GenerationError that is not recovered."""
    push_timeout_s: float = Field(300.0, gt=0.0, le=86_400.0)
    """Seconds each call of a weight push (pause, load, cache reset, resume) may take."""
    push_retries: int = Field(2, ge=0, le=100)
    """Retries of a push whose load was refused or timed out (the server restarted and re-synced
    to the last acknowledged weights before each); past them the push raises WeightSyncError."""
    extra_args: tuple[str, ...] = ()
    """More arguments for `vllm.entrypoints.openai.api_server` (e.g. --max-num-seqs 64)."""


class SpeculationConfig(BaseModel):
    """Speculative decoding in the hf engine (docs/engines.md, "Speculative decoding"): a
    drafter (model-free, or the co-trained draft head) guesses each row's next tokens and one
    forward verifies them. Every emitted token and its log-prob are the policy's own, whatever
    is drafted."""

    model_config = _STRICT
    kind: Literal["off", "suffix", "head"] = "off"
    """off: decode one token per forward (the default). suffix: draft by suffix matching over the
    prompt, the group's sibling samples as they are generated and the past completions of the
    same prompt (engine/drafter.py), verified in one forward per step. head: draft with the draft
    head co-trained in this run (`trainer.draft_head.enabled` true; model/draft_head.py) from each
    row's last hidden state, greedily, up to the head's depth, verified the same way."""
    max_draft: int = Field(8, ge=1, le=64)
    """Most tokens drafted per row per step (the adaptive draft length's ceiling; it starts at 4,
    doubles after a fully accepted draft, halves after a rejected one)."""
    max_match: int = Field(8, ge=1, le=64)
    """Longest context suffix (tokens) the drafter matches."""
    auto_off: bool = True
    """Switch speculation off for a batch size where it measured net-negative: mean tokens emitted
    per row per verifying forward below that forward's time over a plain one-token forward's
    (1 + overhead), each measured over the engine's own steps; re-tried every 64th step there.
    Its choices follow the clock, and a verifying forward rounds differently from one-token
    forwards, so a run with it on is not bit-reproducible; off, every step drafts and a fixed
    seed on one thread gives the same run again (docs/engines.md, "Auto-off")."""
    store_tasks: int = Field(4096, ge=0, le=1 << 20)
    """Prompts whose past completions are kept as draft sources (least recently stored dropped)."""
    store_per_task: int = Field(8, ge=0, le=1024)
    """Past completions kept per prompt (latest first kept), each cut to 1,024 tokens."""
    collapse_check: bool | None = None
    """Stop the run (GenerationError, with both figures) when tokens per row per drafting step
    fall more than collapse_drop below their running level (after 3 figures): a wiped, stale or
    broken drafter. kind head: the figure is a fixed probe's, measured after every weight push
    (greedy, on prompts the engine generated for before: `HFEngine.spec_probe`); kind suffix:
    each step's rollouts' figure. None (the default): on for head, off for suffix (the model-free
    drafter's figure moves with the policy and its store, which is no fault)."""
    collapse_drop: float = Field(0.3, gt=0.0, lt=1.0)
    """The fall below the running level that collapse_check stops at (0.3: 30%)."""


class EngineConfig(BaseModel):
    """Inference for rollouts and eval: in process (hf), a vLLM server (vllm), or a remote
    OpenAI-compatible server (openai)."""

    model_config = _STRICT
    kind: Literal["hf", "openai", "vllm"] = Field("hf", validation_alias=AliasChoices("kind", "type"))
    """hf: transformers in this process, sharing the trained module. vllm: a vLLM OpenAI server
    that posttrain starts (or attaches to with `url`), weights pushed after each optimizer step
    by pause, in-place reload (full weights) or runtime adapter loading (LoRA), prefix-cache
    reset, resume. openai: a server (`posttrain serve`) that gets new weights over HTTP
    (/v1/update_weights) after each optimizer step. `type` is accepted as the old name."""
    url: str | None = None
    """With openai: the server's base URL, e.g. http://127.0.0.1:8000/v1. With vllm: a running
    vLLM server to attach to (started with VLLM_SERVER_DEV_MODE=1, --logprobs-mode
    processed_logprobs, and for LoRA runtime adapter loading); None: posttrain starts one."""
    served_model: str = "posttrain"
    """With openai: the model name sent in each request."""
    api_key: str = "none"
    """With openai: bearer token for the server."""
    admin_token_file: str | None = None
    """With openai: file holding the server's admin token, sent as the bearer token of
    weight updates (/v1/update_weights); None: the POSTTRAIN_ADMIN_TOKEN environment
    variable, and without it `api_key`."""
    timeout_s: float = Field(120.0, gt=0.0, le=86_400.0)
    """With openai or vllm: seconds before one HTTP request is an infra error."""
    concurrency: int = Field(16, ge=1, le=4096)
    """With openai or vllm: concurrent HTTP requests."""
    sync_dir: str | None = None
    """With openai or vllm: folder the trainer writes each weight version to and the server
    reads from (shared disk across hosts); None: <run dir>/weights."""
    keep_versions: int = Field(2, ge=1, le=1000)
    """With openai or vllm: weight versions kept in sync_dir (older ones are deleted)."""
    vllm: VLLMConfig = VLLMConfig()
    """With vllm: the server's settings."""
    context_reuse: bool = True
    """With hf: keep each episode's KV cache between its turns and compute only each later
    turn's new tokens (the observation), when the turn's prompt starts with the kept tokens
    (token-exact; else the whole prompt), on the same weights (a weight push drops every kept
    context); dropped when the episode ends. Greedy completions are identical with it off
    (tested on lookup, document-fields and tool episodes); on by default (bench/kv_reuse.py:
    2.1x fewer prompt tokens computed on 3-turn lookup episodes, 6.3x on a tool world, the episodes
    1.65x faster). False computes every turn's prompt in full."""
    max_batch_tokens: int = Field(16_384, ge=1, le=1 << 30)
    """With hf: most tokens one generation batch holds, rows x (longest prompt + largest
    max_tokens): the KV cache it allocates and a bound on its prefill (whose attention holds
    about 8 bytes per token pair: at most about 8 x this x the longest prompt bytes). Larger
    calls run as several batches, with the same samples (a request's samples never depend on
    batching). Sized so that evaluating every registered domain stays near 1 GiB of engine
    memory on the embedded base; raise it for throughput where memory allows."""
    prefill_chunk_tokens: int | None = Field(2048, ge=1, le=1 << 30)
    """With hf: a prompt longer than this is prefilled in forwards of at most this many positions
    each (the batch's rows at once, each chunk attending to the cache of those before it), so the
    prefill holds chunk x prompt attention scores instead of prompt x prompt and one chunk's MLP
    activations (bench/kv_reuse.py --prefill measures peak memory against prompt length). The
    logits equal one forward's up to float rounding; None: one forward whatever the length. An
    unpadded batch with nothing cached takes one forward under a fused attention kernel (sdpa)."""
    kv_dtype: Literal["auto", "int8"] = "auto"
    """With hf: the KV cache's storage. auto: the model's dtype; int8: int8 values with one float32
    scale per (row, head, position), dequantized at each attention, about 3.6x less KV memory than
    float32 at head dim 32 (1 + 4 / head dim bytes per value), lossy (held-out accuracy measured:
    bench/RESULTS.md, "Long and multi-turn contexts in the hf engine"), 3-4x slower per call on a
    CPU. Only for models whose layers all use full attention."""
    context_budget_tokens: int = Field(131_072, ge=0, le=1 << 30)
    """With hf and context_reuse: most tokens of kept contexts held at once over all episodes;
    past it the least recently stored are dropped (counted as evicted; that turn is then
    computed in full). Each token holds 2 x layers x kv heads x head dim values."""
    generate_dtype: Literal["model", "auto", "bfloat16", "float32"] = "model"
    """With hf: what the engine generates with. model (the default): the trained module itself,
    shared in process (a push changes nothing to copy). auto: bfloat16 where bf16 matmuls run in
    hardware (a CPU with AVX512-BF16 or AMX, a CUDA device that supports them), model elsewhere
    (the run's log names the choice). bfloat16: a bfloat16 copy of the module, its LoRA adapters
    merged (one matmul a projection), refreshed from the module at every push (engine/copy.py): on
    a CPU with bf16 matmul units a decode step reads half the bytes (the real model's rollouts
    1.65x the tokens/s: bench/real_rollouts.py). The trainer keeps its float32 weights, so the
    engine's log-probs differ from the trainer's by bf16 rounding: measured every step as
    train-inference mismatch; set `trainer.mismatch.correction: tis` to take the PPO ratio against
    the trainer's own log-probs. float32: a merged float32 copy (the adapters' three matmuls become
    one, at 4 bytes a weight). Evaluation generates with the module whatever this says. bfloat16
    and float32 not with `speculation.kind: head` (auto is model there)."""
    speculation: SpeculationConfig = SpeculationConfig()
    """Speculative decoding of rollouts (kind off by default; suffix: the model-free drafter). With
    hf: posttrain's own (every field applies). With vllm (a server posttrain starts): kind suffix
    starts it with vLLM's n-gram lookup (`--speculative-config` method ngram, max_draft tokens,
    matches of 2 to max_match tokens over the prompt and the sequence so far; the other fields are
    the hf engine's), whose counters feed the same metrics, for greedy requests only: a sampled
    request is refused, since vLLM 0.32 reports log-probs that are not the policy's for the tokens
    it drafts at a temperature above 0 (docs/engines.md), so `posttrain train` (whose rollouts
    sample) refuses it before any work; kind head is refused (vLLM cannot load
    posttrain's head). With openai: refused. The emitted tokens and log-probs are the policy's own
    wherever speculation runs; see docs/engines.md."""

    @property
    def type(self) -> str:
        """The old name of `kind` (read-only)."""
        return self.kind

    verify_sync: Literal["auto", "on", "off"] = "auto"
    """Check after every weight push that the engine serves the trainer's policy (engine/probe.py):
    one fixed generation request, whose per-token log-probs must equal the trainer's own forward
    within verify_tolerance, else one re-push, then a SyncVerificationError stops the run.
    auto (the default): on for a remote engine (openai, vllm), off in process (hf), where the engine
    holds the trainer's own module and no push can be lost; on: every engine; off: never."""
    verify_tolerance: float | None = Field(None, gt=0.0, le=10.0)
    """Largest |engine log-prob - trainer log-prob| over the probe's tokens that passes; None: by
    the trainer's dtype and the hf engine's `generate_dtype` (the looser): 1e-4 for float32 (vLLM
    matched transformers to 3e-6 on CPU), 5e-2 for bfloat16 (float32 weights under
    trainer.precision bf16_autocast included, and a bf16 inference copy), 1e-2 for float16."""
    verify_prompt_tokens: int = Field(320, ge=1, le=1 << 20)
    """At least this many prompt tokens in the probe: several KV-cache blocks (vLLM caches a
    prefix in whole blocks, 16 tokens by default on a GPU, 128 on its CPU build), so a prefix
    cache not reset after a push shows. It must leave verify_tokens of room in the model."""
    verify_tokens: int = Field(8, ge=1, le=4096)
    """Tokens the probe generates (fewer when the engine ends the sequence first)."""
    fault_window: int = Field(256, ge=1, le=1 << 20)
    """The last this many sampled rollouts that the engine-fault stop counts over (engine/guard.py)."""
    fault_stop_share: float = Field(0.1, gt=0.0, le=1.0)
    """The run stops (EngineFault) when the rollouts masked because the engine's answer was refused
    (token ids outside the vocabulary, impossible log-probs, inconsistent lengths, a weight version
    it was never sent: engine/validate.py) reach this share of `fault_window`; fewer are masked one
    by one and counted (`pipe_engine_faults`). An honest engine has none."""

    @field_validator("verify_sync", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: object) -> object:
        """YAML 1.1 reads a bare on/off as true/false: take them as "on"/"off"."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="after")
    def _url_for_remote(self) -> EngineConfig:
        if self.kind == "openai" and not (self.url or "").startswith(("http://", "https://")):
            raise ValueError(
                f"engine.url must be an http:// or https:// URL when engine.kind is openai, got {self.url!r}"
            )
        if self.kind == "vllm" and self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"engine.url must be an http:// or https:// URL (or unset) with vllm, got {self.url!r}")
        spec = self.speculation.kind
        if spec != "off" and self.kind == "openai":
            raise ValueError(
                f"engine.speculation.kind {spec} applies to the hf and vllm engines; an openai server drafts by "
                "its own settings (posttrain serve: its fast tier, docs/serving.md)"
            )
        if spec == "head" and self.kind == "vllm":
            raise ValueError(
                "engine.speculation.kind head drafts with posttrain's co-trained head, which vLLM cannot load; "
                "with engine.kind vllm use kind suffix (vLLM's n-gram lookup) or the hf engine"
            )
        if spec != "off" and self.kind == "vllm" and self.url is not None:
            raise ValueError(
                "engine.speculation with engine.url: posttrain cannot set the speculative config of a vLLM server "
                "it attaches to; start that server with --speculative-config, or let posttrain start one"
            )
        return self
