"""The OpenAI-compatible HTTP app: endpoints, streaming, health, metrics, admin.

Invariant: every response names the version and tier that served it (body
`model` as `name@version:tier`, `service_tier`, `system_fingerprint`, and the
`x-posttrain-version` / `x-posttrain-tier` headers); every failure leaves as an
OpenAI-shaped error body; every background task (batchers, canary checks)
is owned by the lifespan's TaskGroup and ends with the server. Request bodies
are bounded and parsed, validated and tokenized off the event loop
(serve.limits); /v1/update_weights and every /admin/* endpoint pass the admin
guard (serve.auth) before anything else.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel

from posttrain.configs.serve import ServeConfig
from posttrain.errors import ConfigError, ModelLoadError, PosttrainError
from posttrain.serve import protocol as P
from posttrain.serve.auth import AdminGuard
from posttrain.serve.canary import CanaryController
from posttrain.serve.limits import Admission, Offload, check_tokens, read_body, validate
from posttrain.serve.metrics import ServeMetrics
from posttrain.serve.registry import ModelRegistry, VersionInfo
from posttrain.serve.router import Router
from posttrain.serve.tiers import Deployment, deployment_of
from posttrain.types import GenerationRequest, Image, Message, SamplingParams

log = logging.getLogger("posttrain.serve")
DEFAULT_MAX_TOKENS = 64
GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})


def load_deployment(info: VersionInfo, cfg: ServeConfig, metrics: ServeMetrics) -> Deployment:
    """A deployment of a registry version; the lossy fast mode only where its release gate passed."""
    mode = "int8" if cfg.fast.mode == "int8" and info.fast_mode == "int8" else "lossless"
    return deployment_of(info.path, info.name, cfg, mode, metrics)


@dataclass(frozen=True)
class Prompt:
    """One prompt rendered for a deployment: its token ids and, in the order of their image-token
    runs, the images a vision model reads with them (none for text)."""

    ids: tuple[int, ...]
    images: tuple[Image, ...] = ()


@dataclass
class _Stream:
    """Per-sample streaming state of one prompt."""

    tokens: dict[int, list[int]] = field(default_factory=dict)
    first_token_at: float | None = None
    where: list[P.Served] = field(default_factory=list)


class Server:
    """Wires the router, registry, canary controller and metrics into one app."""

    def __init__(
        self,
        cfg: ServeConfig,
        registry: ModelRegistry | None = None,
        deployments: Sequence[Callable[[ServeMetrics], Deployment]] = (),
    ) -> None:
        if registry is None and not deployments:
            raise ConfigError("serve: give a registry or a model (serve.registry or serve.model)")
        self.cfg, self.registry = cfg, registry
        self.admin = AdminGuard(cfg.admin)
        self.metrics = ServeMetrics()
        self.offload = Offload(cfg.limits.work_threads)
        self.router = Router(self.metrics, cfg.served_name, overflow_queue=cfg.fast.overflow_queue, render=self._render)
        self.controller = CanaryController(
            self.router, cfg.canary, registry, lambda info: load_deployment(info, cfg, self.metrics)
        )
        self._initial: list[Callable[[ServeMetrics], Deployment]] = list(deployments)
        self._loaded: list[Deployment] = []

    def preload(self) -> None:
        """Load the initial deployments now, before the server starts, so a model directory that
        does not load is one error line (a PosttrainError) instead of a lifespan traceback."""
        self._loaded += [build(self.metrics) for build in self._initial]
        self._initial = []

    @asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            self.router.spawn = tg.create_task
            for build in self._initial:
                self._loaded.append(await asyncio.to_thread(build, self.metrics))
            self._initial = []
            for dep in self._loaded:
                self.router.add(dep)
                if self.router.stable is None:
                    self.router.set_routes(dep.name, None, 0.0)
            await self.controller.sync()
            tg.create_task(self.controller.run(stop))
            try:
                yield
            finally:
                stop.set()
                for ev in self.router.stops.values():
                    ev.set()
                self.offload.close()

    # -- request work, off the event loop ---------------------------------
    async def parse(self, request: Request, model: type[BaseModel]) -> Any:
        """The request body as `model`: read within max_body_bytes, then decoded, validated and
        checked against serve.limits in a worker thread."""
        limits = self.cfg.limits
        raw = await read_body(request, limits.max_body_bytes, limits.body_timeout_s)
        return await self.offload.run(validate, raw, model, limits)

    async def _render(self, build: Callable[[Deployment], GenerationRequest], dep: Deployment) -> GenerationRequest:
        return await self.offload.run(build, dep)

    # -- generation -------------------------------------------------------
    def params(self, body: P.ChatRequest | P.CompletionRequest) -> SamplingParams:
        wanted = body.wanted_tokens() or DEFAULT_MAX_TOKENS
        if wanted > self.cfg.max_tokens_limit:
            raise P.ApiError(
                400, f"max_tokens {wanted} exceeds this server's limit {self.cfg.max_tokens_limit}", param="max_tokens"
            )
        return SamplingParams(
            max_tokens=wanted,
            temperature=body.temperature,
            top_p=body.top_p,
            n=body.n,
            seed=body.seed,
            stop=body.stop_list(),
        )

    async def run(
        self,
        kind: Literal["chat", "text"],
        body: Any,
        builds: list[Callable[[Deployment], Prompt]],
        endpoint: str,
    ) -> Response:
        explicit, tier = self.router.resolve(body.model, body.service_tier)
        params = self.params(body)
        if body.stream:
            return StreamingResponse(
                self._stream(kind, body, builds, params, explicit, tier, endpoint), media_type="text/event-stream"
            )
        t0 = time.monotonic()
        states = [_Stream() for _ in builds]
        results = await asyncio.gather(
            *(self._one(b, params, tier, explicit, st, None) for b, st in zip(builds, states)), return_exceptions=True
        )
        self._raise_first(results, tier, endpoint)
        comps = [c for r in results for c in r[0]]
        served = results[0][1]
        self._observe(served, endpoint, 200, t0, states, sum(len(c.token_ids) for c in comps))
        dep = self.router.deployments.get(served.version)
        tok_str = _token_str(dep)
        model = P.model_label(self.cfg.served_name, served)
        rid = P.new_id("chatcmpl" if kind == "chat" else "cmpl")
        want_lp = bool(body.logprobs)
        respond = P.chat_response if kind == "chat" else P.completions_response
        data = await self.offload.run(respond, rid, model, served, comps, want_lp, body.return_token_ids, tok_str)
        return JSONResponse(data, headers=_served_headers(served))

    async def _one(
        self,
        build: Callable[[Deployment], Prompt],
        params: SamplingParams,
        tier: P.Tier,
        explicit: str | None,
        st: _Stream,
        on_token: Callable[[int, Sequence[int]], None] | None,
    ):
        def sink(s: int, ids: Sequence[int]) -> None:
            if st.first_token_at is None:
                st.first_token_at = time.monotonic()
            if on_token is not None:
                on_token(s, ids)

        limits = self.cfg.limits

        def request_for(dep: Deployment) -> GenerationRequest:  # runs in a worker thread (Server._render)
            prompt = build(dep)
            check_tokens(len(prompt.ids), limits)
            return GenerationRequest(prompt.ids, params, images=prompt.images)

        return await self.router.generate(request_for, tier, explicit, sink, st.where)

    def _raise_first(self, results: list[Any], tier: str, endpoint: str) -> None:
        for r in results:
            if isinstance(r, BaseException):
                self.metrics.requests.inc(endpoint=endpoint, tier=tier, version="none", status=_status(r))
                raise r

    def _observe(
        self, served: P.Served, endpoint: str, status: int, t0: float, states: list[_Stream], tokens: int
    ) -> None:
        labels = {"tier": served.tier, "version": served.version}
        self.metrics.requests.inc(endpoint=endpoint, status=status, **labels)
        self.metrics.latency.observe(time.monotonic() - t0, **labels)
        firsts = [s.first_token_at for s in states if s.first_token_at is not None]
        if firsts:
            self.metrics.ttft.observe(min(firsts) - t0, **labels)
        self.metrics.add_tokens(tokens, served.tier, served.version)

    async def _stream(
        self,
        kind: Literal["chat", "text"],
        body: Any,
        builds: list[Callable[[Deployment], Prompt]],
        params: SamplingParams,
        explicit: str | None,
        tier: P.Tier,
        endpoint: str,
    ) -> AsyncIterator[str]:
        t0 = time.monotonic()
        rid = P.new_id("chatcmpl" if kind == "chat" else "cmpl")
        queue: asyncio.Queue[tuple[int, int, Sequence[int]]] = asyncio.Queue()
        states = [_Stream() for _ in builds]
        tasks = [
            asyncio.ensure_future(
                self._one(b, params, tier, explicit, st, lambda s, ids, p=p: queue.put_nowait((p, s, ids)))
            )
            for p, (b, st) in enumerate(zip(builds, states))
        ]
        sent: dict[int, str] = {}
        max_stop = max((len(s) for s in params.stop), default=0)
        try:
            async for event in self._events(
                kind, rid, tier, states, queue, tasks, sent, params, max_stop, body, endpoint, t0
            ):
                yield event
        finally:  # a client that disconnects cancels its generation
            for t in tasks:
                t.cancel()

    async def _events(
        self,
        kind: Literal["chat", "text"],
        rid: str,
        tier: P.Tier,
        states: list[_Stream],
        queue: asyncio.Queue,
        tasks: list[asyncio.Future],
        sent: dict[int, str],
        params: SamplingParams,
        max_stop: int,
        body: Any,
        endpoint: str,
        t0: float,
    ) -> AsyncIterator[str]:
        try:
            while not all(t.done() for t in tasks) or not queue.empty():
                try:
                    p, s, ids = await asyncio.wait_for(queue.get(), timeout=0.05)
                except TimeoutError:
                    continue
                label = states[p].where[0] if states[p].where else P.Served("none", tier, 0)
                dep = self.router.deployments.get(label.version)
                states[p].tokens.setdefault(s, []).extend(ids)
                index = p * params.n + s
                text = _partial_text(dep, states[p].tokens[s], params.stop, max_stop)
                delta = text[len(sent.get(index, "")) :] if text.startswith(sent.get(index, "")) else ""
                first = index not in sent
                if delta or first:
                    sent[index] = sent.get(index, "") + delta
                    model = P.model_label(self.cfg.served_name, label)
                    yield _sse(P.chunk(kind, rid, model, label, index, delta, None, first))
            results = [t.result() for t in tasks]
        except Exception as exc:  # noqa: BLE001 - the stream has started: report the error in-band
            for t in tasks:
                t.cancel()
            err = _as_api_error(exc)
            self.metrics.requests.inc(endpoint=endpoint, tier=tier, version="none", status=err.status)
            yield _sse(err.body())
            yield "data: [DONE]\n\n"
            return
        served = results[0][1]
        model = P.model_label(self.cfg.served_name, served)
        comps = [c for r in results for c in r[0]]
        for index, c in enumerate(comps):
            rest = c.text[len(sent.get(index, "")) :] if c.text.startswith(sent.get(index, "")) else ""
            yield _sse(P.chunk(kind, rid, model, served, index, rest, c.finish_reason, index not in sent))
        if body.stream_options and body.stream_options.include_usage:
            prompt_tokens = sum(len(r[0][0].prompt_ids) for r in results)
            yield _sse(P.usage_chunk(kind, rid, model, served, prompt_tokens, sum(len(c.token_ids) for c in comps)))
        yield "data: [DONE]\n\n"
        self._observe(served, endpoint, 200, t0, states, sum(len(c.token_ids) for c in comps))


def _partial_text(dep: Deployment | None, token_ids: list[int], stop: Sequence[str], max_stop: int) -> str:
    if dep is None:
        return ""
    text = dep.tokenizer.decode(token_ids, skip_special_tokens=True)
    if stop:
        cut = min((text.find(s) for s in stop if s in text), default=-1)
        text = text[:cut] if cut >= 0 else text[: max(0, len(text) - max_stop + 1)]
    return text


def _token_str(dep: Deployment | None) -> Callable[[int], str]:
    def token_str(tid: int) -> str:
        return dep.tokenizer.decode([tid]) if dep is not None else str(tid)

    return token_str


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _served_headers(served: P.Served) -> dict[str, str]:
    return {
        "x-posttrain-version": served.version,
        "x-posttrain-tier": served.tier,
        "x-posttrain-weights": str(served.weights),
    }


def _as_api_error(exc: BaseException) -> P.ApiError:
    if isinstance(exc, P.ApiError):
        return exc
    if isinstance(exc, ConfigError):
        return P.ApiError(400, str(exc))
    if isinstance(exc, PosttrainError):
        return P.ApiError(500, f"{exc.kind} error: {exc}", "server_error", code=exc.kind)
    return P.ApiError(500, f"internal error: {type(exc).__name__}: {exc}", "server_error", code="internal")


def _status(exc: BaseException) -> int:
    return _as_api_error(exc).status


def create_app(server: Server) -> FastAPI:
    """The FastAPI app of a Server."""
    app = FastAPI(title="posttrain", lifespan=server.lifespan)
    app.state.server = server
    router, metrics = server.router, server.metrics
    app.add_middleware(
        Admission,
        limit=server.cfg.limits.max_inflight,
        paths=GENERATION_PATHS,
        refused=metrics.refused,
        limits=server.cfg.limits,
    )

    @app.exception_handler(P.ApiError)
    async def _api_error(request: Request, exc: P.ApiError) -> JSONResponse:
        if exc.status < 500:
            metrics.refused.inc(endpoint=request.url.path, status=exc.status, code=exc.code or "invalid_request")
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _other(request: Request, exc: Exception) -> JSONResponse:
        err = _as_api_error(exc)
        if err.status >= 500:
            log.exception("request failed")
        return JSONResponse(err.body(), status_code=err.status)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body: P.ChatRequest = await server.parse(request, P.ChatRequest)
        messages = tuple(m.to_message() for m in body.messages)
        return await server.run("chat", body, [_chat_builder(messages)], "chat")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body: P.CompletionRequest = await server.parse(request, P.CompletionRequest)
        builds = [_prompt_builder(p) for p in body.prompts()]
        return await server.run("text", body, builds, "completions")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        names = [server.cfg.served_name, f"{server.cfg.served_name}:fast", f"{server.cfg.served_name}:standard"]
        names += [f"{server.cfg.served_name}@{v}" for v in router.deployments]
        return {
            "object": "list",
            "data": [{"id": n, "object": "model", "created": 0, "owned_by": "posttrain"} for n in names],
        }

    @app.get("/health")
    async def health() -> JSONResponse:
        dep = router.deployments.get(router.stable or "")
        problems = {"stable": "no stable version loaded"} if dep is None else dep.alive()
        body = {
            "status": "ok" if not problems else "unavailable",
            "stable": router.stable,
            "canary": router.canary,
            "canary_share": router.share,
            "problems": problems,
        }
        return JSONResponse(body, status_code=200 if not problems else 503)

    @app.get("/metrics")
    async def prom() -> PlainTextResponse:
        for name, dep in router.deployments.items():
            for drafter, st in dep.spec_stats()["drafters"].items():
                metrics.acceptance.set(st["acceptance"], version=name, drafter=drafter)
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/v1/update_weights")
    async def update_weights(request: Request) -> dict[str, Any]:
        server.admin.check(request)
        body: P.UpdateWeightsRequest = await server.parse(request, P.UpdateWeightsRequest)
        dep = router.deployments.get(router.stable or "")
        if dep is None:
            raise P.ApiError(503, "no stable version loaded", "server_error")
        try:
            weights = await asyncio.to_thread(dep.update_weights, body.path)
        except ModelLoadError as exc:
            raise P.ApiError(400, str(exc), param="path") from None
        return {"version": dep.name, "weights": weights}

    @app.get("/admin/state")
    async def state(request: Request) -> dict[str, Any]:
        server.admin.check(request)
        return {
            "stable": router.stable,
            "canary": router.canary,
            "canary_share": router.share,
            "loaded": {
                n: {"weights": d.weights, "fast_mode": d.fast_mode, "spec": d.spec_stats()}
                for n, d in router.deployments.items()
            },
            "checks": [c.__dict__ for c in server.controller.history[-10:]],
        }

    @app.post("/admin/promote")
    async def promote(request: Request) -> dict[str, Any]:
        server.admin.check(request)
        if router.canary is None:
            raise P.ApiError(409, "there is no canary version to promote")
        if server.registry is not None:
            server.registry.promote("manual")
            await server.controller.sync()
        else:
            router.set_routes(router.canary, None, 0.0)
        return {"stable": router.stable, "canary": router.canary}

    @app.post("/admin/rollback")
    async def rollback(request: Request) -> dict[str, Any]:
        server.admin.check(request)
        if router.canary is None:
            raise P.ApiError(409, "there is no canary version to roll back")
        await server.controller.rollback("manual")
        return {"stable": router.stable, "canary": router.canary}

    @app.post("/admin/check")
    async def check(request: Request) -> dict[str, Any]:
        server.admin.check(request)
        res = await server.controller.check()
        return {
            "canary": res.canary,
            "reasons": list(res.reasons),
            "bad_streak": res.bad_streak,
            "action": res.action,
            "stable": router.stable,
            "routed_canary": router.canary,
        }

    return app


def _chat_builder(messages: tuple[Message, ...]) -> Callable[[Deployment], Prompt]:
    """The chat prompt for a deployment, rendered by its standard engine (`encode_chat`, the
    renderer training and evaluation use). A vision model's engine renders each image's token run
    and the images travel with the ids (`GenerationRequest.images`) to the tier's engine, which
    turns them into the model's pixels; an engine that reads text only refuses them
    (engine.base.text_chat), answered as 400 `images_not_supported`: an image is read or refused,
    never dropped between client and model."""
    images = tuple(i for m in messages for i in m.images)  # message order: the runs' order (model.vision.chat)

    def build(dep: Deployment) -> Prompt:
        try:
            return Prompt(tuple(dep.engines["standard"].encode_chat(messages)), images)
        except ConfigError as exc:
            if not images:
                raise
            raise P.ApiError(400, str(exc), param="messages", code="images_not_supported") from None

    return build


def _prompt_builder(prompt: str | list[int]) -> Callable[[Deployment], Prompt]:
    def build(dep: Deployment) -> Prompt:
        if isinstance(prompt, str):
            return Prompt(tuple(dep.tokenizer.encode(prompt, add_special_tokens=False)))
        return Prompt(tuple(int(t) for t in prompt))

    return build
