"""The `hf` engine: a transformers causal LM in process, sampled by a hand-written
KV-cached decoding loop.

Invariant: every Completion's `logprobs[i]` is `log_softmax(logits / T)` of
`token_ids[i]` under the weights of `model_version` (T = 1 for greedy rows),
and a request's samples depend only on (prompt, params, seed), never on the
other requests in the call, on batching, or on whether its prompt was shared
across its group. A group of n samples computes its prompt once and copies
the prompt's KV cache n times. With `context_reuse`, a sample whose request
names a session keeps its context's KV cache after the call
(engine/sessions.py), its last sampled token fed first so the session holds
every token; a later request of that session whose prompt starts
with the kept tokens computes only the rest of its prompt, on the same
weights (an update drops every kept session), so its samples are those of
a full prefill up to float rounding (greedy tokens identical in the tests).
`Completion.cached_tokens` says how many prompt tokens were not computed
for it (a kept session's, or a group-mate's shared prompt).

A vision-language model (a folder with an image token: model/vision.py) reads the images of
a request (`GenerationRequest.images`): its prompt forward gets their pixel values from the
model's processor (`model.vision.pixel_values`), each image in place of its run of image
tokens, and every completion names the pixels it saw (`Completion.pixel_digest`). A request
whose image-token runs do not match its images is refused; a text model refuses images.

With `speculation.kind: suffix` (off by default; models whose layers all use
full attention) each step drafts up to k tokens per row (engine/drafter.py)
and one forward scores them; a drafted token is accepted when it equals the
token the row's own sampler draws at that position (the same per-row noise
as plain decoding), and the first token that differs is emitted in its place.
So every emitted token, and its log-prob, is what plain decoding emits for
the same seed, up to float rounding of a multi-token forward (greedy tokens
identical in the tests): for a deterministic draft d this is the standard
speculative-sampling rule, acceptance with probability p(d) = min(1, p/q)
and, on rejection, a draw from the normalised residual max(0, p - q).
With `speculation.kind: head` the drafts come from a draft head (model/draft_head.py) fed
each row's last hidden state and token, with the same verification; the engine's forward
then runs the decoder and the LM head apart (the same computation as the model's forward) to
keep the hidden states. An in-process engine shares the trainer's head object (every push
carries it); a checkpoint path pushed with `draft_head.pt` beside its weights replaces it.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from posttrain.configs.engine import SpeculationConfig
from posttrain.engine.base import Engine, OnTokens, chat_ids, check_request, text_chat
from posttrain.engine.copy import InferenceCopy
from posttrain.engine.copy import resolve as resolve_dtype
from posttrain.engine.drafter import DraftLength, SuffixIndex, TaskStore
from posttrain.engine.kvcache import compact, new_cache, preload, row_kv, slab_capable, truncate
from posttrain.engine.sampling import row_key, sample_next
from posttrain.engine.sessions import Session, SessionCache, SessionStats
from posttrain.engine.speculate import (
    PROBE_PROMPTS,
    PROBE_ROW_STEPS,
    PROBE_SEED,
    PROBE_TOKENS,
    Governor,
    SpecCounters,
    acceptance_row,
    accepted_lengths,
)
from posttrain.engine.validate import screen
from posttrain.errors import ConfigError, GenerationError, ModelLoadError
from posttrain.progress import rows_done
from posttrain.types import Completion, FinishReason, GenerationRequest, Message, SamplingParams, add_spec


class HFEngineConfig(BaseModel):
    """Knobs of the in-process engine."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    max_batch_rows: int = Field(256, ge=1, le=1 << 16)
    """Most sequences (samples) decoded together in one batch; a group larger
    than this is split into chunks that each compute the prompt once."""

    max_batch_tokens: int = Field(16_384, ge=1, le=1 << 30)
    """Most tokens one batch holds: its rows times (its longest prompt plus its largest
    `max_tokens`), the size of the KV cache it allocates, which also bounds its prefill's
    input (one padded prompt per chunk). The prefill's attention over a prompt of T tokens
    holds about 8 bytes per (query, key) pair, so a batch's prefill holds at most about
    8 x max_batch_tokens x T bytes (1 GiB at 16,384 tokens and the embedded base's 8,192
    positions; measured: 1.1 GiB for 16 rows of 3,000 tokens). Batches are packed shortest
    prompt first; a group whose rows pass it alone is split into chunks (each computes the
    prompt once), down to one row, which runs alone whatever its size."""

    prefix_sharing: bool = True
    """Compute each group's prompt once and copy its KV cache to the n samples;
    False repeats the prompt n times (same samples, more compute)."""

    compact_fraction: float = Field(0.125, ge=0.0, le=1.0)
    """Finished rows stay in the batch (their outputs ignored) until they are
    at least this fraction of it, then all leave at once: dropping a row
    copies the whole KV cache, keeping one costs a row of compute per step.
    0 drops each finished row at once."""

    prefill_chunk_tokens: int | None = Field(2048, ge=1, le=1 << 30)
    """A prompt longer than this is prefilled in forwards of at most this many positions each
    (every row of the batch at once; each chunk attends to the KV cache of the chunks before
    it), so the prefill's activations hold chunk x prompt attention scores instead of prompt x
    prompt, and the MLP's hidden states of one chunk. The logits equal one forward's up to float
    rounding (tested); None: one forward, whatever the length. A batch with no padding and no
    cached context under a fused attention kernel (sdpa, flash) takes one forward anyway (the
    kernel holds no prompt x prompt scores there)."""

    kv_dtype: Literal["auto", "int8"] = "auto"
    """The KV cache's storage: auto, the model's dtype; int8, int8 values with one float32 scale
    per (row, head, position) (absmax / 127 over the head dim), dequantized at every attention
    (one layer's float copy at a time): 1 + 4 / head_dim bytes per value instead of 4 in
    float32. Lossy: logits move by the rounding (bench/RESULTS.md measures held-out accuracy);
    kept sessions hold their contexts dequantized. Only for models whose layers all use full
    attention (the slab cache); others are refused."""

    context_reuse: bool = True
    """Keep the KV cache of each sample whose request names a session (the episode driver
    names each episode's) after its turn, and compute only the new tokens of that session's
    next prompt when it starts with the kept ones (token-exact; else the full prompt). Greedy
    outputs are the same as without it; False computes every prompt in full. Only for models
    whose layers all use full attention (others always compute in full)."""

    check_finite: bool = False
    """Refuse a forward whose logits hold a NaN or an infinity (GenerationError, "broken
    weights?") instead of sampling from them; the server's standard tier turns it on."""

    context_budget_tokens: int = Field(131_072, ge=0, le=1 << 30)
    """Most tokens of kept contexts held at once (over all sessions); storing past it drops
    the least recently stored sessions first (counted as evicted). Each token holds
    2 x layers x kv heads x head dim values of the model's dtype."""

    generate_dtype: Literal["model", "auto", "bfloat16", "float32"] = "model"
    """What the engine generates with (`engine.generate_dtype`): model, the module it was given
    (shared: an update in place is seen at once); auto, bfloat16 where the device multiplies bf16
    in hardware, else model (`engine.copy.resolve`); bfloat16 or float32, an inference copy of it in
    that dtype with its adapters merged (engine/copy.py), re-read from the module at every
    `update_weights(None)`."""

    speculation: SpeculationConfig = SpeculationConfig()
    """Speculative decoding (`engine.speculation`): off, or suffix drafting verified one forward
    per step; only for models whose layers all use full attention (others decode plain). A
    speculative batch's KV cache holds max_draft + 1 + a quarter of its max_tokens more
    positions per row (room for rejected drafts' columns before they are compacted)."""


@dataclass(frozen=True)
class EngineStats:
    """Work done since the engine was built."""

    prompt_tokens: int
    """Prompt tokens computed (a group's shared prompt once; a kept session's tokens not)."""
    generated_tokens: int
    forward_calls: int
    prompt_reused: int = 0
    """Prompt tokens taken from kept sessions instead of being computed (`context_reuse`)."""
    sessions: SessionStats | None = None
    """The session cache's counters (None: context_reuse is off)."""
    last_fed: int = 0
    """Completions' last tokens fed by a batch's closing forward so that their kept sessions
    hold them (`context_reuse`; a row that finishes while others decode is fed by the next step)."""


@dataclass(frozen=True)
class _Row:
    """One sample being decoded."""

    request: int
    sample: int
    key: int
    max_tokens: int
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    session: str | None = None
    """Where this row's context is kept after the call (None: not kept)."""
    cached: int = 0
    """Prompt tokens not computed for this row (`Completion.cached_tokens`)."""


@dataclass(frozen=True)
class _Chunk:
    """Rows that share one prompt forward."""

    prompt: tuple[int, ...]
    rows: tuple[_Row, ...]
    resumed: Session | None = None
    """A kept session whose tokens start the prompt: its first `reuse` tokens are not computed."""
    reuse: int = 0
    pixels: torch.Tensor | None = None
    """The request's pixel values (images x 3 x H x W), fed with the prompt forward; None for text."""


@dataclass
class _Output:
    """What one row has produced so far."""

    token_ids: list[int]
    logprobs: list[float]
    finish: FinishReason | None = None
    stop_hit: bool = False
    cached: int = 0
    spec: tuple[int, ...] = ()
    """Speculation on this row (`Completion.spec`): drafts verified, tokens proposed, tokens accepted."""


class HFEngine(Engine):
    """The Engine protocol over a transformers model held in this process (`in_process`), with
    batched prompt encoding (`encode_chats`) and token callbacks (`StreamingEngine`:
    `generate(requests, on_tokens)`, which the server streams from)."""

    in_process = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: str | torch.device | None = None,
        config: HFEngineConfig | None = None,
        seed: int | None = None,
        draft_head: Any = None,
        processor: Any = None,
    ) -> None:
        from posttrain.model.vision import is_vision_model

        if device is not None:
            model.to(_resolve_device(device))
        self.config = config or HFEngineConfig()
        self.source = model
        """The module the engine was given (the trainer's, in process)."""
        self.generates_with = self._generates_with(model)
        """What generates: model (the module itself), or the dtype of its inference copy."""
        self._copy = None if self.generates_with == "model" else InferenceCopy(model, self.generates_with)
        self.model = model if self._copy is None else self._copy.model
        """What generates: `source` itself, or its inference copy (`generate_dtype`)."""
        self.tokenizer = tokenizer
        self.version = 0
        self.eos_token_id = _primary_eos(model, tokenizer)
        self._eos_ids = _all_eos(model, tokenizer)
        self._pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_id
        from posttrain.model.arch import position_limit

        self._max_positions = position_limit(model.config.get_text_config())  # RoPE scaling's factor included
        self.processor = processor
        """A vision model's processor (images to pixel values); None for a text model."""
        self._image_id: int | None = model.config.image_token_index if is_vision_model(model.config) else None
        if self._image_id is not None and processor is None:
            raise ModelLoadError("a vision model needs its processor (HFEngine(..., processor=...))")
        self._vocab = model.get_input_embeddings().weight.shape[0]
        self._generator = torch.Generator()
        self.seed(seed if seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
        self._prompt_tokens = self._generated_tokens = self._forward_calls = self._prompt_reused = 0
        self._last_fed = 0
        reuse = self.config.context_reuse and slab_capable(model.config)
        self._int8 = self.config.kv_dtype == "int8"
        if self._int8 and not slab_capable(model.config):
            raise ConfigError(
                "engine.kv_dtype int8 needs a model whose layers all use full attention (the slab KV cache); "
                "this one has sliding-window or linear-attention layers: use kv_dtype auto"
            )
        self._sessions = SessionCache(self.config.context_budget_tokens) if reuse else None
        self._lock = threading.RLock()  # one generate or weight update at a time
        self._on_tokens: OnTokens | None = None
        """The running `generate` call's token callback (set and cleared under the lock)."""
        spec = self.config.speculation
        self._spec = spec if spec.kind != "off" and slab_capable(model.config) else None
        self._store = TaskStore(spec.store_tasks, spec.store_per_task)
        self._governor = Governor(enabled=spec.auto_off)
        self._spec_counts = SpecCounters(spec.max_draft)
        self._indexes: dict[int, SuffixIndex] = {}
        """The running call's draft index per request (speculation only)."""
        self.draft_head = draft_head
        """The draft head (model/draft_head.py) that speculation.kind head drafts with."""
        self._hidden: torch.Tensor | None = None
        """With a head drafting: the last forward's final hidden states of its kept positions."""
        self._split = self._head_split() if self._spec is not None and spec.kind == "head" else None
        """(decoder, lm_head) when the head drafts: the forward keeps the hidden states."""
        self._seen: dict[int, str] = {}
        """The running call's pixel digest per request with images (`Completion.pixel_digest`)."""
        self._probe_prompts: list[tuple[int, ...]] = []
        """With speculation: `spec_probe`'s prompts (distinct text prompts generated for before its first call)."""
        self._probe_fixed = False
        """Whether `spec_probe` ran: its prompts are fixed from then on."""

    def for_evaluation(self) -> HFEngine:
        """The engine evaluation generates with: this one when it generates with the module itself;
        with an inference copy, a twin over the module (the policy's own weights and dtype: what a
        checkpoint saves and the server serves), sharing the tokenizer, draft head, processor and
        this engine's version (`_ModuleTwin`)."""
        return self if self._copy is None else _ModuleTwin(self)

    def _generates_with(self, model: Any) -> str:
        """`generate_dtype` resolved on the model's device (`engine.copy.resolve`): model, bfloat16
        or float32; auto under a drafting head is model (the head drafts from the module's hidden
        states), and bfloat16 or float32 there is a ConfigError."""
        kind = self.config.generate_dtype
        if self.config.speculation.kind == "head":
            if kind in ("model", "auto"):
                return "model"
            raise ConfigError(
                f"engine.generate_dtype {kind}: the draft head drafts from the trained module's hidden "
                "states; use generate_dtype model with speculation.kind head"
            )
        return resolve_dtype(kind, next(model.parameters()).device)

    def _head_split(self) -> tuple[Any, Any]:
        """The model's decoder and LM head, for speculation.kind head (ConfigError without a head
        or a model that does not expose them)."""
        if self.draft_head is None:
            raise ConfigError(
                "engine.speculation.kind head: no draft head to draft with (set trainer.draft_head.enabled "
                "true, or give the engine a model folder with draft_head.pt)"
            )
        decoder, head = self.model.get_decoder(), self.model.get_output_embeddings()
        if decoder is None or head is None or decoder is self.model:
            raise ConfigError("engine.speculation.kind head: the model does not expose its decoder and LM head")
        return decoder, head

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        device: str = "auto",
        dtype: Any = None,
        config: HFEngineConfig | None = None,
        seed: int | None = None,
    ) -> HFEngine:
        """An engine over a local Hugging Face model directory (a vision model's with its processor)."""
        from posttrain.model.arch import load_model
        from posttrain.model.vision import is_vision_dir, load_vlm

        where, kind = str(_resolve_device(device)), _resolve_dtype(dtype)
        if is_vision_dir(path):
            model, tokenizer, proc = load_vlm(path, device=where, dtype=kind)
            return cls(model, tokenizer, config=config, seed=seed, processor=proc)
        model, tokenizer = load_model(path, device=where, dtype=kind)
        from posttrain.model.draft_head import has_head, load

        head = load(path, model.config.hidden_size).to(model.device, model.dtype) if has_head(path) else None
        return cls(model, tokenizer, config=config, seed=seed, draft_head=head)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def seed(self, seed: int) -> None:
        """Reseed the generator that draws seeds for requests without one."""
        self._generator.manual_seed(int(seed) % (1 << 63))

    def stats(self) -> EngineStats:
        sessions = self._sessions.stats() if self._sessions is not None else None
        return EngineStats(
            self._prompt_tokens,
            self._generated_tokens,
            self._forward_calls,
            self._prompt_reused,
            sessions,
            self._last_fed,
        )

    def counters(self) -> dict[str, int]:
        """With speculation: its counters (engine/speculate.py `SpecCounters`: verifying forwards,
        drafts verified, draft tokens proposed and accepted, in all and per depth, plain, auto-off
        and drafting row-steps), which the loop's metrics row carries prefixed `engine_`; else none."""
        return self._spec_counts.counters() if self._spec is not None else {}

    def spec_probe(self) -> dict[str, float]:
        """Speculation measured on a fixed probe, outside the run's figures: greedy generation (seed
        PROBE_SEED, up to PROBE_TOKENS tokens) of the probe's prompts, drafting at every step (the
        auto-off governor bypassed); returns its `acceptance_row` (`spec_step_len`,
        `spec_accepted_len`, `spec_acceptance`, per depth) and `spec_drafting` (the drafting
        row-steps they were measured over), empty without speculation or before any prompt.

        The prompts: the distinct text prompts this engine generated for before the first call (at
        most PROBE_PROMPTS), fixed from then on; the first call keeps the fewest of them, in order,
        that its own measure says give about PROBE_ROW_STEPS drafting row-steps (at least one), so
        a model with long answers probes a few prompts and one with 3-token answers all of them.
        The engine's counters, statistics, governor and draft store are as they were before the
        call (`WeightSync.push` runs it after every push: docs/engines.md, "Collapse check")."""
        with self._lock:  # a generate in another thread (the async pipeline) adds prompts under it
            if self._spec is None or not self._probe_prompts:
                return {}
            first, self._probe_fixed = not self._probe_fixed, True
            counts = self._probe_counts(self._probe_prompts)
            if first:
                n = len(self._probe_prompts)
                keep = min(n, max(1, math.ceil(n * PROBE_ROW_STEPS / max(counts["spec_drafting"], 1))))
                if keep < n:
                    self._probe_prompts = self._probe_prompts[:keep]
                    counts = self._probe_counts(self._probe_prompts)
        return {**acceptance_row(counts, {}), "spec_drafting": counts["spec_drafting"]}

    def _probe_counts(self, prompts: Sequence[tuple[int, ...]]) -> dict[str, int]:
        """`spec_probe`'s generation of `prompts`: its own speculation counters, the engine's restored."""
        assert self._spec is not None
        params = SamplingParams(max_tokens=PROBE_TOKENS, temperature=0.0, seed=PROBE_SEED)
        requests = [GenerationRequest(prompt, params) for prompt in prompts]
        with self._lock:
            saved = (self._spec_counts, self._governor, self._hidden)
            figures = (self._prompt_tokens, self._generated_tokens, self._forward_calls, self._prompt_reused)
            last_fed = self._last_fed
            self._spec_counts, self._governor = SpecCounters(self._spec.max_draft), Governor(enabled=False)
            try:
                self._generate_rows(self._plan(requests))
                return self._spec_counts.counters()
            finally:
                self._spec_counts, self._governor, self._hidden = saved
                self._prompt_tokens, self._generated_tokens, self._forward_calls, self._prompt_reused = figures
                self._last_fed = last_fed
                self._indexes = {}

    def end_sessions(self, keys: Sequence[str]) -> None:
        """The episodes `keys` ended: their kept contexts are dropped (without waiting for a
        generation in progress)."""
        if self._sessions is not None:
            self._sessions.end(keys)

    # -- text -----------------------------------------------------------------

    def encode_chat(self, messages: Sequence[Message]) -> tuple[int, ...]:
        if messages and not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(
                "the tokenizer has no chat_template: encode_chat needs a chat model "
                "(or pass prompt_ids rendered another way)"
            )
        if self._image_id is not None:
            return self._vision_ids(messages)
        return chat_ids(self.tokenizer, messages)

    def _vision_ids(self, messages: Sequence[Message]) -> tuple[int, ...]:
        """A vision model's prompt: the chat template over content parts, each image's token
        expanded to the model's run (`model.vision.expand_ids`, what its processor does)."""
        from posttrain.model.vision import chat, expand_ids

        if not messages:
            raise ConfigError("messages is empty: encode_chat needs at least one message")
        out = self.tokenizer.apply_chat_template(chat(messages), add_generation_prompt=True, tokenize=True)
        ids = out["input_ids"] if hasattr(out, "keys") else out
        assert self._image_id is not None
        return expand_ids([int(i) for i in ids], self._image_id, self.model.config.image_seq_length)

    def encode_chats(self, prompts: Sequence[Sequence[Message]]) -> list[tuple[int, ...] | Exception]:
        """Each prompt's ids as `encode_chat` gives them, or the error encoding it raised: one
        batched chat-template call (one render pass, one batched tokenizer call: the same ids at
        about a third of the CPU) when every prompt is non-empty and the tokenizer has a chat
        template; prompt by prompt otherwise, or when the batched call fails. (A subclass that
        renders chats another way overrides `encode_chat` and this method both.)"""
        if prompts and all(prompts) and getattr(self.tokenizer, "chat_template", None) and self._image_id is None:
            try:
                chats = [text_chat(p) for p in prompts]  # one with images: each prompt alone, below
                out = self.tokenizer.apply_chat_template(chats, add_generation_prompt=True, tokenize=True)
                rows = out["input_ids"] if hasattr(out, "keys") else out
                if len(rows) == len(prompts):
                    return [tuple(int(i) for i in row) for row in rows]
            except Exception:  # noqa: S110 - every prompt is encoded alone below, raising its own error
                pass
        return super().encode_chats(prompts)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    # -- weights --------------------------------------------------------------

    def update_weights(self, source: Any = None) -> int:
        """None: the model object was updated in place (a shared draft head too; an inference copy
        re-reads it); a state dict: load it into what generates; a path: load that Hugging Face
        checkpoint directory's weights, and its draft head when it holds one (`draft_head.pt`).
        Returns the new version."""
        state = _read_checkpoint(source) if isinstance(source, (str, Path)) else source
        with self._lock:
            if state is not None:
                _load_state(self.model, state)
            elif self._copy is not None:  # the module changed in place: re-read it
                self._copy.refresh()
            if isinstance(source, (str, Path)) and self.draft_head is not None:
                self.draft_head = _pushed_head(source, self.draft_head)
            self.version += 1
            if self._sessions is not None:  # contexts computed on the old weights no longer hold
                self._sessions.clear()
            return self.version

    # -- generation -----------------------------------------------------------

    def generate(
        self, requests: Sequence[GenerationRequest], on_tokens: OnTokens | None = None
    ) -> list[list[Completion]]:
        """For each request, `params.n` completions in sample order. `on_tokens` (the
        StreamingEngine capability; the server streams from it): called in this thread with
        (request index, sample index, (token id,)) for each token a sample draws, in order,
        each token once (a stop string's tokens are reported before it is cut)."""
        for i, req in enumerate(requests):
            self._validate(i, req)
        with self._lock:
            version = self.version
            self._on_tokens = on_tokens
            try:
                outputs = self._generate_rows(self._plan(requests))
            finally:
                self._on_tokens = None
                self._indexes = {}
                seen, self._seen = self._seen, {}
            if self._spec is not None:  # each completion becomes a draft source for its prompt's next call
                for req in requests:  # spec_probe's prompts: distinct text prompts before its first call
                    prompt = tuple(req.prompt_ids)
                    room = not self._probe_fixed and len(self._probe_prompts) < PROBE_PROMPTS
                    if room and not req.images and prompt not in self._probe_prompts:
                        self._probe_prompts.append(prompt)
                for i, req in enumerate(requests):
                    for j in range(req.params.n):
                        self._store.add(req.prompt_ids, outputs[(i, j)].token_ids)
            outs = [
                [self._completion(req, outputs[(i, j)], seen.get(i, "")) for j in range(req.params.n)]
                for i, req in enumerate(requests)
            ]
            return screen(requests, outs, self._vocab, (version, self.version))  # text: decoded here, by construction

    def _generate_rows(self, chunks: list[_Chunk]) -> dict[tuple[int, int], _Output]:
        outputs: dict[tuple[int, int], _Output] = {}
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                for batch in _pack(chunks, self.config.max_batch_rows, self.config.max_batch_tokens):
                    outputs.update(self._run_batch(batch) if self._spec is None else self._run_batch_spec(batch))
                    rows_done(sum(len(c.rows) for c in batch))  # a listener's progress bar (posttrain/progress.py)
        except RuntimeError as exc:  # torch failures, out-of-memory included: infra, not the task
            raise GenerationError(f"hf engine failed while decoding: {exc}") from exc
        finally:
            self.model.train(was_training)
        return outputs

    def _validate(self, i: int, req: GenerationRequest) -> None:
        limit = "the model's max_position_embeddings"
        check_request(i, req, self._vocab, self._max_positions, limit, images=self._image_id is not None)
        if self._image_id is None:
            return
        run = self.model.config.image_seq_length
        found = sum(1 for t in req.prompt_ids if t == self._image_id)
        if found != run * len(req.images):
            raise ConfigError(
                f"requests[{i}] has {found} image tokens for {len(req.images)} image(s) of {run} tokens each: "
                "an image missing from the request, or a prompt not rendered by this engine's encode_chat"
            )

    def _pixels(self, req: GenerationRequest) -> torch.Tensor | None:
        """The request's pixel values on the model's device (None without images)."""
        if not req.images:
            return None
        from posttrain.model.vision import pixel_values

        return pixel_values(self.processor, req.images).to(self.device, self.model.dtype)

    def _plan(self, requests: Sequence[GenerationRequest]) -> list[_Chunk]:
        """Rows of every request, grouped into prompt-sharing chunks."""
        chunks: list[_Chunk] = []
        share = self.config.prefix_sharing
        for i, req in enumerate(requests):
            rows = self._rows(i, req)
            pixels = self._pixels(req)
            if pixels is not None:
                from posttrain.model.vision import pixel_digest

                self._seen[i] = pixel_digest(pixels)
            resumed = self._resumed(req) if pixels is None else None
            reuse = 0 if resumed is None else min(len(resumed.tokens), len(req.prompt_ids) - 1)
            span = len(req.prompt_ids) + max((r.max_tokens for r in rows), default=0)
            limit = max(1, min(self.config.max_batch_rows, self.config.max_batch_tokens // max(1, span)))
            if share:
                parts = [rows[k : k + limit] for k in range(0, len(rows), limit)]
                shared = len(req.prompt_ids)
                chunks += [_Chunk(req.prompt_ids, _cached(p, reuse, shared), resumed, reuse, pixels) for p in parts]
            else:
                chunks += [_Chunk(req.prompt_ids, _cached((row,), reuse, 0), resumed, reuse, pixels) for row in rows]
        return sorted(chunks, key=lambda c: len(c.prompt))

    def _resumed(self, req: GenerationRequest) -> Session | None:
        """The kept session a one-sample request resumes (`SessionCache.take`), or None."""
        if self._sessions is None or len(req.sessions) != 1:
            return None
        got = self._sessions.take(req.sessions[0], tuple(req.prompt_ids), self.version)
        return got if got is not None and len(req.prompt_ids) > 1 else None

    def _rows(self, i: int, req: GenerationRequest) -> tuple[_Row, ...]:
        p = req.params
        seed = p.seed if p.seed is not None else int(torch.randint(0, 1 << 62, (1,), generator=self._generator).item())
        room = p.max_tokens if self._max_positions is None else self._max_positions - len(req.prompt_ids)
        keep = req.sessions if self._sessions is not None else ()
        return tuple(
            _Row(
                i,
                j,
                row_key(seed, j),
                min(p.max_tokens, room),
                float(p.temperature),
                float(p.top_p),
                tuple(p.stop),
                keep[j] if keep else None,
            )
            for j in range(p.n)
        )

    def _forward(
        self,
        input_ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        keep: int = 1,
        pixels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits of the last input position (batch, vocab); with `keep` > 1, of the last `keep`
        positions (batch, keep, vocab). `pixels`: a vision model's images, in the order of the
        image-token runs of `input_ids` (row by row)."""
        if self._split is not None:
            if pixels is not None:
                raise ConfigError("engine.speculation.kind head: a vision model's requests cannot draft with a head")
            return self._forward_split(input_ids, mask, positions, cache, keep)
        extra = {} if pixels is None else {"pixel_values": pixels}
        out = self.model(
            **extra,
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=keep,
        )
        self._forward_calls += 1
        logits: torch.Tensor = out.logits[:, -1, :].float() if keep == 1 else out.logits[:, -keep:, :].float()
        return self._check(logits)

    def _forward_split(
        self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any, keep: int = 1
    ) -> torch.Tensor:
        """`_forward` as the decoder and the LM head apart (the model's own forward does the
        same), keeping the last `keep` positions' final hidden states in `_hidden`."""
        assert self._split is not None
        decoder, lm_head = self._split
        out = decoder(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
        )
        self._forward_calls += 1
        self._hidden = out.last_hidden_state[:, -keep:, :]
        logits = lm_head(self._hidden).float()
        return self._check(logits[:, -1, :] if keep == 1 else logits)

    def _check(self, logits: torch.Tensor) -> torch.Tensor:
        """`logits`, refused (GenerationError) when non-finite under `check_finite`."""
        if self.config.check_finite and not bool(torch.isfinite(logits).all()):
            raise GenerationError("model produced non-finite logits (broken weights?)")
        return logits

    def _forward_prompt(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        positions: torch.Tensor,
        cache: Any,
        pixels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The prompt forward of `ids` (batch x width, after the cache's first mask.shape[1] -
        width columns): in chunks of at most `prefill_chunk_tokens` columns, each over the
        mask up to its end, appending to the cache; the logits of the last position. One
        forward when nothing is padded or cached before and the attention is a fused kernel
        (sdpa, flash): it then holds no width x width scores, and chunks would only cost
        (bench/RESULTS.md, "Long and multi-turn contexts in the hf engine": 0.86 s and 13 MB
        against 1.54 s and 77 MB at 8,000 tokens on a CPU). With `pixels` (a vision model's
        images) one forward, so no image's tokens are split from its pixels."""
        width, step = ids.shape[1], self.config.prefill_chunk_tokens or ids.shape[1]
        past = mask.shape[1] - width
        fused = getattr(self.model.config, "_attn_implementation", None) in _FUSED_ATTENTION
        if (fused and past == 0 and bool(mask.all())) or pixels is not None:
            return self._forward(ids, mask, positions, cache, pixels=pixels)  # image tokens stay with their pixels
        logits = None
        for a in range(0, width, step):
            b = min(width, a + step)
            logits = self._forward(ids[:, a:b], mask[:, : past + b], positions[:, a:b], cache)
        assert logits is not None  # width >= 1: every prompt has a token
        return logits

    def _prefill(self, batch: list[_Chunk], capacity: int) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Forward each chunk's prompt once (left-padded), then copy its cache
        to its rows. Returns (cache, logits_bv, mask_bt, next_position_b)."""
        if any(c.reuse for c in batch):
            return self._prefill_resumed(batch, capacity)
        dev = self.device
        width = max(len(c.prompt) for c in batch)
        ids = torch.full((len(batch), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for k, c in enumerate(batch):
            ids[k, width - len(c.prompt) :] = torch.tensor(c.prompt, dtype=torch.long)
            mask[k, width - len(c.prompt) :] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = new_cache(self.model.config, width + capacity, sum(len(c.rows) for c in batch), self._int8)
        seen = [c.pixels for c in batch if c.pixels is not None]
        logits = self._forward_prompt(ids, mask, positions, cache, pixels=torch.cat(seen) if seen else None)
        self._prompt_tokens += sum(len(c.prompt) for c in batch)
        return self._expand(batch, cache, logits, mask, positions)

    def _prefill_resumed(
        self, batch: list[_Chunk], capacity: int
    ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """`_prefill` where some chunks resume a kept session: the cache starts with each kept
        context right-aligned at the first `longest` positions, and only each prompt's rest
        (left-padded) is forwarded, at its own positions (the kept tokens' count on)."""
        dev = self.device
        longest = max(c.reuse for c in batch)
        rests = [c.prompt[c.reuse :] for c in batch]
        width = max(len(r) for r in rests)
        ids = torch.full((len(batch), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), longest + width), dtype=torch.long)
        positions = torch.zeros((len(batch), width), dtype=torch.long)
        for k, (c, rest) in enumerate(zip(batch, rests)):
            ids[k, width - len(rest) :] = torch.tensor(rest, dtype=torch.long)
            mask[k, longest - c.reuse : longest] = 1
            mask[k, longest + width - len(rest) :] = 1
            positions[k, width - len(rest) :] = torch.arange(c.reuse, len(c.prompt))
        ids, mask, positions = ids.to(dev), mask.to(dev), positions.to(dev)
        cache = new_cache(self.model.config, longest + width + capacity, sum(len(c.rows) for c in batch), self._int8)
        kept = [(k, _head(c.resumed, c.reuse)) for k, c in enumerate(batch) if c.resumed is not None and c.reuse]
        preload(cache, len(batch), longest, kept)
        logits = self._forward_prompt(ids, mask, positions, cache)
        self._prompt_tokens += sum(len(r) for r in rests)
        self._prompt_reused += sum(c.reuse for c in batch)
        return self._expand(batch, cache, logits, mask, positions)

    def _expand(
        self, batch: list[_Chunk], cache: Any, logits: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor
    ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each chunk's prefilled cache, logits and mask copied to its rows."""
        dev = self.device
        counts = torch.tensor([len(c.rows) for c in batch], device=dev)
        expand = torch.repeat_interleave(torch.arange(len(batch), device=dev), counts)
        if len(expand) != len(batch):
            cache.reorder_cache(expand)
        if self._hidden is not None:
            self._hidden = self._hidden[expand]
        return cache, logits[expand], mask[expand], positions[expand, -1] + 1

    def _run_batch(self, batch: list[_Chunk]) -> dict[tuple[int, int], _Output]:
        """Decode every row of a batch to its end. A finished row stays in the
        batch (its output ignored) until finished rows make up
        `compact_fraction` of it; then they are all dropped at once."""
        rows = [r for c in batch for r in c.rows]
        prompts = [c.prompt for c in batch for _ in c.rows]
        dev = self.device
        cache, logits, mask, next_pos = self._prefill(batch, max(r.max_tokens for r in rows))
        temp = torch.tensor([r.temperature for r in rows], dtype=torch.float32, device=dev)
        top_p = torch.tensor([r.top_p for r in rows], dtype=torch.float32, device=dev)
        keys = torch.tensor([r.key for r in rows], dtype=torch.int64, device=dev)
        outs = [_Output([], [], cached=r.cached) for r in rows]
        active = list(range(len(rows)))  # batch position -> row
        last_pos = (self._max_positions or (1 << 62)) - 1
        step = 0
        while True:
            tokens, lps = sample_next(logits, temp, top_p, keys, step)
            tok_list, lp_list = tokens.tolist(), lps.tolist()
            live = [k for k, r in enumerate(active) if outs[r].finish is None]
            self._record(rows, outs, [active[k] for k in live], [tok_list[k] for k in live], [lp_list[k] for k in live])
            left = self._retire(cache, mask, active, rows, prompts, outs, next_pos, tokens, temp, top_p, keys)
            if left is None:
                break
            active, mask, (next_pos, tokens, temp, top_p, keys) = left
            mask = torch.cat([mask, mask.new_ones((len(active), 1))], dim=1)
            logits = self._forward(tokens[:, None], mask, next_pos.clamp(max=last_pos)[:, None], cache)
            next_pos = next_pos + 1
            step += 1
        return {(r.request, r.sample): o for r, o in zip(rows, outs)}

    def _run_batch_spec(self, batch: list[_Chunk]) -> dict[tuple[int, int], _Output]:
        """`_run_batch` with speculation: each step drafts up to k tokens per unfinished row,
        feeds [last token, draft...] in one forward and keeps, per row, the drafted tokens that
        equal what its sampler draws there plus the first one drawn after them (the module
        docstring's rule). Rejected columns leave the KV cache: the shared length is cut to the
        longest kept run, shorter rows mask the rest (holes `compact` removes when the slab
        would overflow)."""
        spec = self._spec
        assert spec is not None
        rows = [r for c in batch for r in c.rows]
        prompts = [c.prompt for c in batch for _ in c.rows]
        dev = self.device
        room = max(r.max_tokens for r in rows)
        cache, logits, mask, next_pos = self._prefill(batch, room + _spec_slack(room, spec.max_draft))
        capacity = mask.shape[1] + room + _spec_slack(room, spec.max_draft)
        temp = torch.tensor([r.temperature for r in rows], dtype=torch.float32, device=dev)
        top_p = torch.tensor([r.top_p for r in rows], dtype=torch.float32, device=dev)
        keys = torch.tensor([r.key for r in rows], dtype=torch.int64, device=dev)
        outs = [_Output([], [], cached=r.cached) for r in rows]
        lengths = [DraftLength(spec.max_draft) for _ in rows]
        by_head = self._split is not None
        index = [] if by_head else [self._draft_index(r.request, p) for r, p in zip(rows, prompts)]
        sids = [ix.add_sequence() for ix in index]
        # the head drafts from each row's hidden state where its last token was chosen
        hid = self._hidden[:, -1] if by_head and self._hidden is not None else torch.empty(len(rows), 0, device=dev)
        active = list(range(len(rows)))  # batch position -> row
        last_pos = (self._max_positions or (1 << 62)) - 1
        tokens, lps = sample_next(logits, temp, top_p, keys, 0)
        runs = [([t], [lp]) for t, lp in zip(tokens.tolist(), lps.tolist())]
        while True:
            self._record_runs(rows, outs, active, runs, index, sids)
            left = self._retire(cache, mask, active, rows, prompts, outs, next_pos, temp, top_p, keys, hid)
            if left is None:
                break
            active, mask, (next_pos, temp, top_p, keys, hid) = left
            started = time.perf_counter()
            live = [outs[r].finish is None for r in active]
            speculate = self._governor.speculate(len(active))
            self._spec_counts.off_steps += int(not speculate)
            self._spec_counts.drafting += sum(live) if speculate else 0
            if by_head:
                drafts = self._head_drafts(hid, active, rows, outs, lengths, live if speculate else [])
            else:
                drafts = [
                    self._draft(index[r], prompts[r], outs[r].token_ids, lengths[r].value, rows[r].max_tokens)
                    if speculate and ok
                    else []
                    for r, ok in zip(active, live)
                ]
            width = 1 + max(len(d) for d in drafts)
            last = torch.tensor([outs[r].token_ids[-1] for r in active], dtype=torch.long, device=dev)
            steps = torch.tensor([len(outs[r].token_ids) for r in active], dtype=torch.int64, device=dev)
            fed = torch.zeros((len(active), width), dtype=mask.dtype)
            for k, (r, d, ok) in enumerate(zip(active, drafts, live)):  # a finished row: its last token, once
                fed[k, : 1 + len(d)] = int(ok or self._unfed(mask, k, rows[r], prompts[r], outs[r]))
            fed = fed.to(dev)
            if mask.shape[1] + width > capacity:  # rejected drafts' holes would overflow the slab
                mask = compact(cache, mask)
            if width == 1:
                mask = torch.cat([mask, fed], dim=1)
                logits = self._forward(last[:, None], mask, next_pos.clamp(max=last_pos)[:, None], cache)
                hid = self._hidden[:, -1] if by_head and self._hidden is not None else hid
                tokens, lps = sample_next(logits, temp, top_p, keys, steps)
                runs = [([t], [lp]) for t, lp in zip(tokens.tolist(), lps.tolist())]
                next_pos = next_pos + 1
                self._spec_counts.plain_steps += 1
                self._governor.record(len(active), False, time.perf_counter() - started)
                continue
            ids = torch.full((len(active), width), self._pad_id, dtype=torch.long)
            ids[:, 0] = last.cpu()
            for k, d in enumerate(drafts):
                ids[k, 1 : 1 + len(d)] = torch.tensor(d, dtype=torch.long)
            ids = ids.to(dev)
            offsets = torch.arange(width, device=dev)
            positions = (next_pos[:, None] + offsets[None, :]).clamp(max=last_pos)
            before = mask.shape[1]
            logits_bwv = self._forward(ids, torch.cat([mask, fed], dim=1), positions, cache, keep=width)
            flat_steps = (steps[:, None] + offsets[None, :]).reshape(-1)
            tok_bw, lp_bw = sample_next(
                logits_bwv.reshape(len(active) * width, -1),
                temp.repeat_interleave(width),
                top_p.repeat_interleave(width),
                keys.repeat_interleave(width),
                flat_steps,
            )
            tok_bw, lp_bw = tok_bw.reshape(len(active), width), lp_bw.reshape(len(active), width)
            accepted = accepted_lengths(tok_bw[:, :-1], ids[:, 1:], fed[:, 1:] > 0)
            if by_head and self._hidden is not None:  # where each row's last emitted token was chosen
                hid = self._hidden[torch.arange(len(active), device=dev), accepted]
            kept = int(accepted.max()) + 1
            truncate(cache, before + kept)
            mask = torch.cat([mask, fed[:, :kept] * (offsets[None, :kept] <= accepted[:, None])], dim=1)
            next_pos = next_pos + accepted + 1
            acc, tok_l, lp_l = accepted.tolist(), tok_bw.tolist(), lp_bw.tolist()
            runs = [(tok_l[k][: a + 1], lp_l[k][: a + 1]) for k, a in enumerate(acc)]
            self._spec_counts.forwards += 1
            for k, (d, a) in enumerate(zip(drafts, acc)):
                if d:
                    self._spec_counts.add(len(d), a)
                    lengths[active[k]].update(len(d), a)
                    outs[active[k]].spec = add_spec(outs[active[k]].spec, (1, len(d), a))
            gain = sum(a + 1 for a, ok in zip(acc, live) if ok) / max(1, sum(live))
            self._governor.record(len(active), True, time.perf_counter() - started, gain)
        return {(r.request, r.sample): o for r, o in zip(rows, outs)}

    def _retire(
        self,
        cache: Any,
        mask: torch.Tensor,
        active: list[int],
        rows: list[_Row],
        prompts: list[tuple[int, ...]],
        outs: list[_Output],
        *per_row: torch.Tensor,
    ) -> tuple[list[int], torch.Tensor, tuple[torch.Tensor, ...]] | None:
        """Finished rows leave the batch, for both decode loops: None when every active row is
        finished (each kept session stored, `_feed_last` first); else the active rows, the mask
        and `per_row`'s tensors (one entry per batch position; `per_row[0]` each row's next
        position), with the finished rows dropped (their sessions kept first) once they make up
        `compact_fraction` of the batch, unchanged before that. A finished row whose session
        lacks its last token's keys and values (sampled, not yet fed) stays one step more: the
        next forward feeds it (the plain loop feeds every row; the speculative loop, `_feeds`)."""
        keep = [k for k, r in enumerate(active) if outs[r].finish is None]
        if not keep:
            mask = self._feed_last(cache, mask, per_row[0], active, rows, prompts, outs)
            self._keep_sessions(cache, mask, range(len(active)), active, rows, prompts, outs)
            return None
        gone = [
            k
            for k, r in enumerate(active)
            if outs[r].finish is not None and not self._unfed(mask, k, rows[r], prompts[r], outs[r])
        ]
        if len(gone) < max(1, self.config.compact_fraction * len(active)):
            return active, mask, per_row
        self._keep_sessions(cache, mask, gone, active, rows, prompts, outs)
        stay = [k for k in range(len(active)) if k not in set(gone)]
        idx = torch.tensor(stay, device=self.device)
        cache.reorder_cache(idx)
        return [active[k] for k in stay], mask[idx], tuple(t[idx] for t in per_row)

    def _unfed(self, mask: torch.Tensor, k: int, row: _Row, prompt: tuple[int, ...], out: _Output) -> bool:
        """Whether batch position `k` keeps a session whose last token has no KV column yet: its
        mask marks fewer columns than its prompt and every output token."""
        if self._sessions is None or row.session is None:
            return False
        return int(mask[k].sum()) < len(prompt) + len(out.token_ids)

    def _feed_last(
        self,
        cache: Any,
        mask: torch.Tensor,
        next_pos: torch.Tensor,
        active: list[int],
        rows: list[_Row],
        prompts: list[tuple[int, ...]],
        outs: list[_Output],
    ) -> torch.Tensor:
        """The batch is over: one forward feeds the last token of each row whose kept session
        lacks it (`_unfed`), the other rows masked, so the session holds every token of its
        context and the next turn computes only what follows it. Returns the new mask."""
        need = [k for k, r in enumerate(active) if self._unfed(mask, k, rows[r], prompts[r], outs[r])]
        if not need:
            return mask
        layer = cache.layers[0]
        if mask.shape[1] + 1 > layer.capacity:  # speculation's rejected columns fill the slab: close them up
            mask = compact(cache, mask)
        dev = self.device
        last = torch.full((len(active), 1), self._pad_id, dtype=torch.long)
        fed = torch.zeros((len(active), 1), dtype=mask.dtype)
        for k in need:
            last[k, 0], fed[k, 0] = outs[active[k]].token_ids[-1], 1
        mask = torch.cat([mask, fed.to(dev)], dim=1)
        last_pos = (self._max_positions or (1 << 62)) - 1
        self._forward(last.to(dev), mask, next_pos.clamp(max=last_pos)[:, None], cache)
        self._last_fed += len(need)
        return mask

    def _draft_index(self, request: int, prompt: tuple[int, ...]) -> SuffixIndex:
        """The running call's draft index of request `request`: its prompt and the past
        completions kept for it (made on first use)."""
        got = self._indexes.get(request)
        if got is None:
            assert self._spec is not None
            got = self._indexes[request] = SuffixIndex(prompt, max_n=self._spec.max_match)
            for past in self._store.get(prompt):
                got.add_sequence(past)
        return got

    def _head_drafts(
        self,
        hid: torch.Tensor,
        active: list[int],
        rows: list[_Row],
        outs: list[_Output],
        lengths: list[DraftLength],
        live: list[bool],
    ) -> list[list[int]]:
        """Each active row's draft from the draft head (`live[k]` false or missing: none): up to
        its adaptive length, leaving room for the token the policy adds within max_tokens, and
        cut after a drafted eos."""
        ks = [
            min(lengths[r].value, rows[r].max_tokens - len(outs[r].token_ids) - 1) if k < len(live) and live[k] else 0
            for k, r in enumerate(active)
        ]
        most = max(ks, default=0)
        if most < 1:
            return [[] for _ in active]
        from posttrain.model.draft_head import policy_tables

        last = torch.tensor([outs[r].token_ids[-1] for r in active], dtype=torch.long, device=hid.device)
        embed_vh, lm_vh = policy_tables(self.model)
        drafted = self.draft_head.draft(hid, last, most, embed_vh, lm_vh).tolist()
        return [_to_eos(d[:k], self._eos_ids) for d, k in zip(drafted, ks)]

    def _draft(self, index: SuffixIndex, prompt: tuple[int, ...], out: list[int], k: int, max_tokens: int) -> list[int]:
        """Up to `k` drafted tokens after `prompt + out`, leaving room for the token the policy
        adds after them within `max_tokens`."""
        k = min(k, max_tokens - len(out) - 1)
        n = index.max_n
        context = out[-n:] if len(out) >= n else list(prompt[len(prompt) - (n - len(out)) :]) + out
        return index.propose(context, k)

    def _record_runs(
        self,
        rows: list[_Row],
        outs: list[_Output],
        active: list[int],
        runs: list[tuple[list[int], list[float]]],
        index: list[SuffixIndex],
        sids: list[int],
    ) -> None:
        """`_record` of each active row's run of new tokens (`runs[k]` for row `active[k]`), one
        depth at a time, so a row stops at its first eos, stop string or max_tokens; then the
        recorded tokens join the draft index."""
        sizes = [len(outs[r].token_ids) for r in active]
        depth = 0
        while True:
            ks = [k for k, r in enumerate(active) if outs[r].finish is None and depth < len(runs[k][0])]
            if not ks:
                break
            self._record(
                rows, outs, [active[k] for k in ks], [runs[k][0][depth] for k in ks], [runs[k][1][depth] for k in ks]
            )
            depth += 1
        for k, r in enumerate(active):
            if index and len(outs[r].token_ids) > sizes[k]:  # no index: the draft head drafts
                index[r].extend(sids[r], outs[r].token_ids[sizes[k] :])

    def _keep_sessions(
        self,
        cache: Any,
        mask: torch.Tensor,
        positions: Sequence[int],
        active: list[int],
        rows: list[_Row],
        prompts: list[tuple[int, ...]],
        outs: list[_Output],
    ) -> None:
        """Keep the context of each finished row at batch `positions` that names a session: its
        prompt and every output token (the last one fed after it was sampled: `_retire`), with
        the first KV columns its mask marks (after them, speculation may have fed accepted
        drafts past a row's end, and the plain loop the tokens of later steps)."""
        if self._sessions is None:
            return
        for k in positions:
            r = active[k]
            row, out = rows[r], outs[r]
            if row.session is None:
                continue
            tokens = prompts[r] + tuple(out.token_ids)
            columns = mask[k].nonzero().squeeze(-1)[: len(tokens)]
            if len(columns) != len(tokens):
                raise RuntimeError(f"kept context of {len(columns)} positions for {len(tokens)} tokens")
            keys, values = row_kv(cache, k, columns)
            self._sessions.put(row.session, Session(tokens, keys, values, self.version))

    def _record(
        self, rows: list[_Row], outs: list[_Output], active: list[int], tokens: list[int], logprobs: list[float]
    ) -> None:
        """Append each unfinished row's new token, report it to the call's `on_tokens`, and
        decide whether the row is done. `active` holds only rows that were unfinished before
        this step, `tokens[k]` is row `active[k]`'s new token."""
        self._generated_tokens += len(active)
        for r, tok, lp in zip(active, tokens, logprobs):
            out, row = outs[r], rows[r]
            out.token_ids.append(tok)
            out.logprobs.append(lp)
            if self._on_tokens is not None:
                self._on_tokens(row.request, row.sample, (tok,))
            if tok in self._eos_ids:
                out.finish = "stop"
            elif row.stop and self._hits_stop(out.token_ids, row.stop):
                out.finish, out.stop_hit = "stop", True
            elif len(out.token_ids) >= row.max_tokens:
                out.finish = "length"

    def _hits_stop(self, token_ids: list[int], stop: tuple[str, ...]) -> bool:
        """Whether the text now ends inside a window that contains a stop string."""
        window = max(len(s) for s in stop) + 1
        tail = self.decode(token_ids[-window:])
        return any(s in tail for s in stop)

    def _completion(self, req: GenerationRequest, out: _Output, pixel_digest: str = "") -> Completion:
        body = out.token_ids[:-1] if out.token_ids and out.token_ids[-1] in self._eos_ids else out.token_ids
        text = self.decode(body)
        if out.stop_hit:
            text = text[: min((text.find(s) for s in req.params.stop if s in text), default=len(text))]
        return Completion(
            prompt_ids=tuple(req.prompt_ids),
            token_ids=tuple(out.token_ids),
            text=text,
            logprobs=tuple(out.logprobs),
            finish_reason=out.finish or "length",
            model_version=self.version,
            cached_tokens=out.cached,
            pixel_digest=pixel_digest,
            spec=out.spec,
        )


def generates_with(engine: Engine) -> str:
    """What `engine` generates with: an hf engine's `generates_with` (model, or its inference copy's
    dtype); model for any other engine (its weights are the server's own)."""
    return engine.generates_with if isinstance(engine, HFEngine) else "model"


class _ModuleTwin(HFEngine):
    """An hf engine over another's module (`HFEngine.for_evaluation`): it generates with the module
    itself, and its version is the other's (the pushes number the weights they both read)."""

    def __init__(self, primary: HFEngine) -> None:
        self._primary = primary
        config = primary.config.model_copy(update={"generate_dtype": "model"})
        super().__init__(
            primary.source,
            primary.tokenizer,
            config=config,
            seed=0,  # evaluation's requests carry their own seeds
            draft_head=primary.draft_head,
            processor=primary.processor,
        )

    @property  # type: ignore[override]
    def version(self) -> int:
        return self._primary.version

    @version.setter
    def version(self, value: int) -> None:
        """Ignored: HFEngine's constructor and updates set it; the primary's pushes number the weights."""


def _to_eos(draft: list[int], eos: frozenset[int]) -> list[int]:
    """`draft` up to and including its first eos (nothing after an end is ever emitted, so
    verifying or counting it would only cost time and inflate the acceptance figures)."""
    for i, tok in enumerate(draft):
        if tok in eos:
            return draft[: i + 1]
    return draft


_FUSED_ATTENTION = frozenset({"sdpa", "flash_attention_2", "flash_attention_3"})
"""Attention implementations that compute an unpadded causal prompt without materialising its
scores (torch's fused kernels): such a prompt is prefilled in one forward."""


def _spec_slack(room: int, max_draft: int) -> int:
    """KV positions a speculative batch holds per row beyond its prompt and `room` generated tokens:
    one step's draft (at least max_draft + 1, which `compact` needs) and a quarter of `room` for
    rejected drafts' columns before they are compacted."""
    return max_draft + 1 + room // 4


def _cached(rows: tuple[_Row, ...], reused: int, shared: int) -> tuple[_Row, ...]:
    """`rows` of one chunk with their `cached` counts: the first computes the prompt but the
    `reused` tokens of a kept session, the others share it (`shared` tokens not computed)."""
    return tuple(replace(r, cached=reused if j == 0 else shared) for j, r in enumerate(rows))


def _head(session: Session, n: int) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Per layer, the keys and values of the session's first `n` tokens."""
    if n == len(session.tokens):
        return session.keys, session.values
    return tuple(k[:, :n] for k in session.keys), tuple(v[:, :n] for v in session.values)


def _pack(chunks: list[_Chunk], max_rows: int, max_tokens: int = 1 << 62) -> list[list[_Chunk]]:
    """Consecutive chunks grouped into batches of at most `max_rows` rows whose KV cache (rows x
    (longest prompt + largest max_tokens)) holds at most `max_tokens` tokens; a chunk that alone
    passes a bound is a batch of its own."""
    batches: list[list[_Chunk]] = []
    rows = width = room = 0
    for c in chunks:
        n, w, r = len(c.rows), max(width, len(c.prompt)), max(room, max(x.max_tokens for x in c.rows))
        if not batches or rows + n > max_rows or (rows + n) * (w + r) > max_tokens:
            batches.append([])
            rows, w, r = 0, len(c.prompt), max(x.max_tokens for x in c.rows)
        batches[-1].append(c)
        rows, width, room = rows + n, w, r
    return batches


def _resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {str(device)!r} requested but CUDA is not available")
    return dev


def _resolve_dtype(dtype: Any) -> Any:
    if dtype is None or dtype == "auto" or isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype):
        raise ConfigError(f"dtype {dtype!r} is not a torch dtype (e.g. 'float32', 'bfloat16', or 'auto')")
    return resolved


def _primary_eos(model: Any, tokenizer: Any) -> int:
    if tokenizer.eos_token_id is not None:
        return int(tokenizer.eos_token_id)
    ids = sorted(_all_eos(model, tokenizer))
    if not ids:
        raise ModelLoadError("model has no eos token id (neither tokenizer nor generation_config)")
    return ids[0]


def _all_eos(model: Any, tokenizer: Any) -> frozenset[int]:
    """Every token id that ends a completion: the tokenizer's eos and the
    generation config's (which may be a list)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(extra, int):
        ids.add(extra)
    elif extra:
        ids.update(int(e) for e in extra)
    return frozenset(ids)


def _pushed_head(path: str | Path, head: Any) -> Any:
    """The draft head a pushed checkpoint folder holds (`draft_head.pt`), on the device and dtype
    of `head`; `head` itself when the folder holds none."""
    from posttrain.model.draft_head import has_head, load

    if not has_head(path):
        return head
    ref = next(head.parameters())
    return load(path, head.hidden).to(ref.device, ref.dtype)


def _read_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """The weights of a Hugging Face checkpoint directory as one state dict."""
    from posttrain.model.arch import check_model_dir

    p = check_model_dir(path)
    state: dict[str, torch.Tensor] = {}
    files = sorted(p.glob("*.safetensors"))
    if files:
        from safetensors.torch import load_file

        for f in files:
            state.update(load_file(str(f)))
    else:
        for f in sorted(p.glob("pytorch_model*.bin")):
            state.update(torch.load(f, map_location="cpu", weights_only=True))
    return state


def _load_state(model: Any, state: Mapping[str, torch.Tensor]) -> None:
    """Copy `state` into the model's parameters; every parameter must be
    covered, except those tied to one that is (tied embeddings)."""
    if not isinstance(state, Mapping):
        raise ModelLoadError(
            f"update_weights takes None, a state dict or a checkpoint path, got {type(state).__name__}"
        )
    own = model.state_dict()
    unexpected = sorted(set(state) - set(own))
    if unexpected:
        raise ModelLoadError(f"state dict has keys the model lacks: {unexpected[:5]}")
    loaded_ptrs = {own[k].data_ptr() for k in state}
    missing = [k for k in own if k not in state and own[k].data_ptr() not in loaded_ptrs]
    if missing:
        raise ModelLoadError(f"state dict lacks weights for: {missing[:5]}")
    bad = [k for k, v in state.items() if tuple(v.shape) != tuple(own[k].shape)]
    if bad:
        raise ModelLoadError(f"state dict shapes differ from the model's for: {bad[:5]}")
    with torch.no_grad():
        model.load_state_dict(dict(state), strict=False)
