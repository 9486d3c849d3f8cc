"""Two tiers from one weight source, each behind a dynamic batcher.

Invariant: the standard and fast engines of a deployment read the same
float weights (one model object); the fast tier's int8 copies are derived
from them and rebuilt on every weight update, under a lock that no engine
call holds at the same time. Every queued job's future is resolved exactly
once: with its completions or with an exception; a batch that fails is
retried one job at a time, so one bad request never fails its neighbours.
A vision-language model's deployment (a processor beside its weights) reads
images in both tiers through one hf engine: its fast tier is that engine (the
drafters and the lean decoder read text decoders only), never an engine that
drops the pixels.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from posttrain.configs.serve import BatchConfig, FastTierConfig, ServeConfig
from posttrain.contracts.engine import StreamingEngine
from posttrain.engine.drafter import TaskStore
from posttrain.engine.hf import HFEngine, HFEngineConfig
from posttrain.errors import ConfigError, GenerationError
from posttrain.model.arch import position_limit
from posttrain.serve.lean import HeadDrafter, LeanDecoder, LeanDrafter, LeanTarget
from posttrain.serve.metrics import ServeMetrics
from posttrain.serve.protocol import Tier
from posttrain.serve.spec import ModelDrafter, SpecStats, SpeculativeEngine, SuffixDrafter, int8_copy
from posttrain.types import Completion, GenerationRequest

TokenSink = Callable[[int, Sequence[int]], None]
"""Per-job streaming callback: (sample index, new token ids), on the event loop."""


def standard_engine(model: Any, tokenizer: Any, processor: Any = None) -> HFEngine:
    """The standard tier's engine: the `hf` engine, refusing non-finite logits
    (`HFEngineConfig.check_finite`); it streams through `generate(requests, on_tokens)`, the
    StreamingEngine capability. A vision model's `processor` turns a request's images into the
    pixels its prompt forward reads (engine/hf.py), the same path training generates by."""
    return HFEngine(model, tokenizer, config=HFEngineConfig(check_finite=True), processor=processor)


def deployment_of(path: str, name: str, cfg: ServeConfig, mode: str, metrics: ServeMetrics) -> Deployment:
    """The deployment of the model folder `path` (or a registered name such as `posttrain-vlm`):
    a vision-language model (model/vision.py) with its processor, any other through the text
    loader with its draft head if it has one, which the fast tier drafts with (ModelLoadError
    when it does not load). `mode`: the fast tier's, "lossless" or "int8"."""
    from posttrain.model.vision import is_vision_dir, load_vlm

    head = processor = None
    if is_vision_dir(path):
        model, tok, processor = load_vlm(path)
    else:
        from posttrain.model.arch import load_model
        from posttrain.model.draft_head import load_if_any

        model, tok = load_model(path)
        head = load_if_any(path, model)
    return Deployment(name, model, tok, cfg.fast, mode, cfg.standard_batch, metrics, cfg.torch_threads, head, processor)


def _vision_state(path: str) -> dict[str, Any]:
    """The parameters of the vision-language model folder `path`, named as the loaded module
    names them (ModelLoadError when it is not one that loads)."""
    from posttrain.model.vision import load_vlm

    return load_vlm(path)[0].state_dict()


def build_fast(
    model: Any, tokenizer: Any, cfg: FastTierConfig, mode: str, version: int, head: Any = None
) -> SpeculativeEngine:
    """The fast tier's engine: float target with drafts (lossless) or int8 target (lossy). The
    model-free drafter (`cfg.ngram`) keeps past completions per prompt for as long as this engine
    lives (until the next weight update). A co-trained draft `head` (the model folder's, or
    None) drafts first when `cfg.head` and the target is lean (lossless mode)."""
    drafters: list[Any] = []
    lengths: list[int] = []
    if cfg.ngram:
        store = TaskStore(max_tasks=cfg.past_prompts, per_task=cfg.past_per_prompt, max_len=cfg.past_tokens)
        drafters.append(SuffixDrafter(max_n=cfg.ngram_max, min_n=2, store=store))  # 1-token matches are noise
        lengths.append(cfg.ngram_tokens)
    if mode == "int8":
        if cfg.target == "lean":
            lossy = LeanDecoder(model, int8=True)
            return SpeculativeEngine(
                model,
                tokenizer,
                drafters,
                lengths,
                version=version,
                target=lambda: LeanTarget(lossy),
                model_draft_after=cfg.model_draft_after,
            )
        return SpeculativeEngine(int8_copy(model), tokenizer, drafters, lengths, version=version)
    draft = cfg.draft_model
    if draft == "auto":
        draft = "lean-int8" if draft_cost_ratio(model) < cfg.auto_draft_cost else "none"
    if draft in ("lean", "lean-int8"):
        drafters.append(LeanDrafter(model, draft, int8=draft == "lean-int8"))
    elif draft == "int8":
        drafters.append(ModelDrafter(int8_copy(model), "int8"))
    if draft != "none":
        lengths.append(cfg.draft_model_tokens)
    target = None
    if cfg.target == "lean":
        decoder = LeanDecoder(model)
        target = lambda: LeanTarget(decoder)  # noqa: E731
        if head is not None and cfg.head:  # the head reads the target's hidden state: no extra forward
            drafters.insert(0, HeadDrafter(head, decoder))
            lengths.insert(0, head.depth)
    return SpeculativeEngine(
        model, tokenizer, drafters, lengths, version=version, target=target, model_draft_after=cfg.model_draft_after
    )


def draft_cost_ratio(model: Any, reps: int = 8) -> float:
    """CPU time of one lean-int8 draft step over one lean float32 target step
    (best of `reps`, after a warm-up); small models are compute-bound and gain
    nothing from int8, large ones are memory-bound and gain a lot."""

    def step_cost(decoder: LeanDecoder) -> float:
        decoder.forward(list(range(1, 17)))
        best = float("inf")
        for _ in range(reps):
            decoder.truncate(16)
            t0 = time.process_time()
            decoder.forward([1])
            best = min(best, time.process_time() - t0)
        return best

    try:
        target = step_cost(LeanDecoder(model, max_positions=32))
        return step_cost(LeanDecoder(model, max_positions=32, int8=True)) / max(target, 1e-9)
    except (RuntimeError, ConfigError):  # weights int8 cannot represent (e.g. non-finite): no int8 draft
        return float("inf")


def check_request(req: GenerationRequest, vocab: int, max_positions: int | None) -> None:
    """ConfigError naming the field when a request cannot be served."""
    if not req.prompt_ids:
        raise ConfigError("prompt: empty prompt")
    bad = [t for t in req.prompt_ids if not 0 <= t < vocab]
    if bad:
        raise ConfigError(f"prompt: token ids outside [0, {vocab}): {bad[:5]}")
    if max_positions is not None and len(req.prompt_ids) >= max_positions:
        raise ConfigError(
            f"prompt: {len(req.prompt_ids)} tokens leaves no room in the model's {max_positions} positions"
        )


@dataclass
class _Job:
    request: GenerationRequest
    future: asyncio.Future
    sink: TokenSink | None
    queued: float = field(default_factory=time.monotonic)


class Batcher:
    """Collects concurrent jobs of one tier into engine calls on one worker thread."""

    def __init__(
        self,
        get_engine: Callable[[], StreamingEngine],
        cfg: BatchConfig,
        lock: threading.Lock,
        metrics: ServeMetrics,
        tier: Tier,
        version: str,
        threads: int = 1,
    ) -> None:
        self.get_engine, self.cfg, self.lock = get_engine, cfg, lock
        self.metrics, self.tier, self.version, self.threads = metrics, tier, version, threads
        self.queue: asyncio.Queue[_Job] = asyncio.Queue()
        self.pool = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"{version}-{tier}", initializer=_set_threads, initargs=(threads,)
        )
        self.dead: str | None = None
        self.running = False

    async def submit(self, req: GenerationRequest, sink: TokenSink | None = None) -> list[Completion]:
        fut = asyncio.get_running_loop().create_future()
        await self.queue.put(_Job(req, fut, sink))
        return await fut

    async def run(self, stop: asyncio.Event) -> None:
        """The worker loop; returns when `stop` is set, failing queued jobs."""
        self.running = True
        try:
            while not stop.is_set():
                jobs = await self._collect(stop)
                if jobs:
                    await self._serve(jobs)
        finally:
            self.running = False
            self._fail_queued(GenerationError(f"{self.version}/{self.tier}: server shutting down"))
            self.pool.shutdown(wait=False, cancel_futures=True)

    async def _collect(self, stop: asyncio.Event) -> list[_Job]:
        try:
            first = await asyncio.wait_for(self.queue.get(), timeout=0.2)
        except TimeoutError:
            return []
        jobs = [first]
        deadline = time.monotonic() + self.cfg.max_wait_ms / 1000
        while len(jobs) < self.cfg.max_batch:
            left = deadline - time.monotonic()
            if left <= 0 and self.queue.empty():
                break
            try:
                jobs.append(self.queue.get_nowait() if left <= 0 else await asyncio.wait_for(self.queue.get(), left))
            except (TimeoutError, asyncio.QueueEmpty):
                break
        return jobs

    async def _serve(self, jobs: list[_Job]) -> None:
        loop = asyncio.get_running_loop()
        self.metrics.batch_size.observe(len(jobs), tier=self.tier)
        try:
            results = await loop.run_in_executor(self.pool, self._call, jobs, loop)
            self.dead = None
        except Exception as exc:  # noqa: BLE001 - isolate the failing job(s)
            if len(jobs) > 1:
                for job in jobs:
                    await self._serve([job])
                return
            self._note_failure(exc)
            if not jobs[0].future.done():
                jobs[0].future.set_exception(exc)
            return
        for job, res in zip(jobs, results):
            if not job.future.done():
                job.future.set_result(res)

    def _call(self, jobs: list[_Job], loop: asyncio.AbstractEventLoop) -> list[list[Completion]]:
        def on_tokens(r: int, s: int, ids: Sequence[int]) -> None:
            sink = jobs[r].sink
            if sink is not None:
                loop.call_soon_threadsafe(sink, s, tuple(ids))

        streaming = any(j.sink for j in jobs)
        with self.lock:
            engine = self.get_engine()
            reqs = [j.request for j in jobs]
            return engine.generate(reqs, on_tokens=on_tokens) if streaming else engine.generate(reqs)

    def _note_failure(self, exc: BaseException) -> None:
        kind = getattr(exc, "kind", "infra")
        if not isinstance(exc, ConfigError):
            self.dead = f"{type(exc).__name__}: {exc}"
        self.metrics.errors.inc(tier=self.tier, version=self.version, kind=kind)

    def _fail_queued(self, exc: BaseException) -> None:
        while not self.queue.empty():
            job = self.queue.get_nowait()
            if not job.future.done():
                job.future.set_exception(exc)


def _set_threads(n: int) -> None:

    torch.set_num_threads(n)


class Deployment:
    """One released version: a model, its two tier engines and their batchers."""

    def __init__(
        self,
        name: str,
        model: Any,
        tokenizer: Any,
        fast_cfg: FastTierConfig,
        fast_mode: str,
        standard_batch: BatchConfig,
        metrics: ServeMetrics,
        threads: int = 1,
        head: Any = None,
        processor: Any = None,
    ) -> None:
        self.name, self.model, self.tokenizer, self.head = name, model, tokenizer, head
        self.processor = processor
        """A vision model's processor; None for a text model."""
        self.fast_cfg, self.fast_mode = fast_cfg, "lossless" if processor is not None else fast_mode
        self.locks: dict[Tier, threading.Lock] = {"standard": threading.Lock(), "fast": threading.Lock()}
        self.engines: dict[Tier, Any] = {"standard": standard_engine(model, tokenizer, processor)}
        self.engines["fast"] = self._fast(0)
        self.batchers: dict[Tier, Batcher] = {
            "standard": Batcher(
                lambda: self.engines["standard"],
                standard_batch,
                self.locks["standard"],
                metrics,
                "standard",
                name,
                threads,
            ),
            "fast": Batcher(
                lambda: self.engines["fast"], fast_cfg.batch, self.locks["fast"], metrics, "fast", name, threads
            ),
        }
        self.vocab = model.get_input_embeddings().weight.shape[0]
        self.max_positions = position_limit(model.config.get_text_config())

    @property
    def weights(self) -> int:
        return int(self.engines["standard"].version)

    def alive(self) -> dict[str, str]:
        """Tier -> why it is dead; empty when both tiers are up."""
        out = {}
        for tier, b in self.batchers.items():
            if not b.running:
                out[tier] = "worker not running"
            elif b.dead:
                out[tier] = b.dead
        return out

    def update_weights(self, path: str) -> int:
        """Load a checkpoint into the shared weights and rebuild the fast tier (blocking), with the
        checkpoint's draft head when it holds one (else none: a head fitted to older weights is
        dropped). A LoRA adapter directory is merged into the base weights held at the first
        adapter update. A vision model's folder is read through the vision loader (its saved
        parameter names are not its module's), so its weights load whole or not at all."""
        from posttrain.model.draft_head import load_if_any
        from posttrain.trainer.lora import resolve_update

        with self.locks["standard"], self.locks["fast"]:
            source = resolve_update(self.model, path) if self.processor is None else _vision_state(path)
            version = self.engines["standard"].update_weights(source)
            if self.processor is None:
                self.head = load_if_any(path, self.model)
            self.engines["fast"] = self._fast(version)
        return version

    def _fast(self, version: int) -> Any:
        """The fast tier's engine: speculation over the float weights (build_fast); for a vision
        model the standard tier's hf engine itself, which reads the images (its own lock keeps
        one generate at a time across the two batchers)."""
        if self.processor is not None:
            return self.engines["standard"]
        return build_fast(self.model, self.tokenizer, self.fast_cfg, self.fast_mode, version, self.head)

    def spec_stats(self) -> dict[str, Any]:
        """The fast tier's speculation counters (all zero for a vision model: it does not draft)."""
        fast = self.engines["fast"]
        return (fast.stats if isinstance(fast, SpeculativeEngine) else SpecStats()).as_dict()
