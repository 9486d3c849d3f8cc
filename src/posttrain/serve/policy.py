"""A rule-based chat "model" behind `posttrain serve --policy package.module:function`.

Invariant: the reply to a /v1/chat/completions request is exactly what the
callable returns for the request's messages (a list of {role, content}); the
request is read and validated under the same limits as a model's (serve.limits),
and the callable runs off the event loop. A callable that cannot be imported,
or is not callable, is a ConfigError at start (one line, exit 2); one that
raises on a request answers 500 with its error, and one that returns something
other than a string answers 500. There are no weights, tiers, canaries or
streaming: this is a seam for testing clients of the API, such as the byo LLM
judge and its bias checks (docs/byo.md), with a judge whose policy is known.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from posttrain.configs.serve import ServeConfig
from posttrain.errors import ConfigError
from posttrain.serve import protocol as P
from posttrain.serve.limits import read_body, validate

Policy = Callable[[list[dict[str, str]]], str]


def load_policy(path: str) -> Policy:
    """The callable at `package.module:function`, the current directory importable."""
    module_name, _, attr = path.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"serve: policy {path!r} cannot be imported: {exc}") from None
    if not callable(obj):
        raise ConfigError(f"serve: policy {path!r} is not callable")
    return obj  # type: ignore[no-any-return]


class PolicyServer:
    """The state of a policy app: its config and, after `preload`, its callable."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.policy: Policy | None = None

    def preload(self) -> None:
        if self.policy is None and self.cfg.policy:
            self.policy = load_policy(self.cfg.policy)

    def reply(self, messages: list[dict[str, str]]) -> str:
        self.preload()
        if self.policy is None:
            raise P.ApiError(503, "no policy loaded", "server_error")
        out = self.policy(messages)
        if not isinstance(out, str):
            raise P.ApiError(500, f"policy returned {type(out).__name__}, not a string", "server_error")
        return out


def policy_app(cfg: ServeConfig) -> FastAPI:
    """The FastAPI app serving `cfg.policy`."""
    server = PolicyServer(cfg)
    app = FastAPI(title="posttrain policy")
    app.state.server = server
    name = f"{cfg.served_name}@policy"

    @app.exception_handler(P.ApiError)
    async def _api_error(request: Request, exc: P.ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _other(request: Request, exc: Exception) -> JSONResponse:
        err = P.ApiError(500, f"policy failed: {type(exc).__name__}: {exc}", "server_error")
        return JSONResponse(err.body(), status_code=500)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        limits = cfg.limits
        raw = await read_body(request, limits.max_body_bytes, limits.body_timeout_s)
        body: P.ChatRequest = await asyncio.to_thread(validate, raw, P.ChatRequest, limits)
        if body.stream:
            raise P.ApiError(400, "a policy server does not stream", param="stream")
        if any(m.images() for m in body.messages):
            raise P.ApiError(
                400,
                "this policy server reads text only: a request with image parts is refused, not passed on without them",
                param="messages",
                code="images_not_supported",
            )
        messages = [{"role": m.role, "content": m.to_message().content} for m in body.messages]
        text = await asyncio.to_thread(server.reply, messages)
        message = {"role": "assistant", "content": text}
        return {
            "id": P.new_id("chatcmpl"),
            "object": "chat.completion",
            "model": name,
            "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}],
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "posttrain"}]}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "policy": cfg.policy}

    return app
