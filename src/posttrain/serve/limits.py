"""Bounds on what one client request makes the server hold or compute.

Invariant: each bound is checked before the work it bounds. The body is read
from the stream only up to `max_body_bytes` (a larger Content-Length is
refused before a byte is read); its nesting depth is measured by a linear scan
before the JSON parser runs, so no parser recursion depends on the client;
prompt characters are counted before the tokenizer runs and prompt tokens
after it. Parsing, validation and tokenizing run in a fixed pool of worker
threads (`Offload`), never on the event loop, and at most `max_inflight`
generation requests are admitted at once (`Admission`; one more gets 429 at
once), so a flood of large requests holds at most `max_inflight` bodies and
cannot stall /health. A generation request takes its in-flight slot only once
its whole body has arrived (within `body_timeout_s`, 408 after; at most
`max_body_bytes`, 413 above), so clients trickling bodies hold no slot: they
hold only their own connections, which serve/connections.py bounds per client.
A chat request's image parts are counted (`max_images`) and each decoded under
`max_image_bytes` and `max_image_pixels` in the same worker thread
(serve/images.py: sizes checked before decoding). Every refusal is an
`ApiError` naming the limit.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from posttrain.configs.serve import LimitsConfig
from posttrain.serve.images import decode_image_url
from posttrain.serve.metrics import Counter
from posttrain.serve.protocol import ApiError, ChatRequest, CompletionRequest, ImagePart

T = TypeVar("T")
ADMITTED = "posttrain.admitted"
"""Scope key `Admission` sets once a request holds an in-flight slot (serve/connections.py reads it)."""
_STEP = np.zeros(256, dtype=np.int32)  # byte -> change of nesting depth
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1


def too_slow(timeout_s: float) -> ApiError:
    """The 408 error of a body not received within `timeout_s` seconds."""
    return ApiError(
        408, f"request body not received within {timeout_s:g} s (serve.limits.body_timeout_s)", code="request_timeout"
    )


def too_large(limit: int) -> ApiError:
    """The 413 error of a body over `limit` bytes."""
    return ApiError(
        413,
        f"request body exceeds this server's limit of {limit} bytes (serve.limits.max_body_bytes)",
        param=None,
        code="request_too_large",
    )


def check_declared_length(declared: str | None, limit: int) -> None:
    """A request's Content-Length header (None: absent) refused with 400 when it is not a
    number and with 413 when it declares more than `limit` bytes."""
    if declared is None:
        return
    if not (declared.isascii() and declared.isdigit()):
        raise ApiError(400, f"invalid Content-Length header {declared[:40]!r}")
    if len(declared) > 18 or int(declared) > limit:
        raise too_large(limit)


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The request body, refused with 413 when its Content-Length or the bytes received exceed
    `limit`, and with 408 when it has not all arrived within `timeout_s`."""
    check_declared_length(request.headers.get("content-length"), limit)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise too_large(limit)
                chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(400, "client disconnected before sending its whole body", code="client_disconnected") from None
    except TimeoutError:
        raise too_slow(timeout_s) from None
    return b"".join(chunks)


def json_depth(raw: bytes) -> int:
    """Deepest nesting of arrays and objects in `raw`, brackets inside JSON strings skipped.

    Vectorised and linear in the body size (no recursion, no backtracking): a quote
    opens or closes a string unless an odd run of backslashes precedes it."""
    a = np.frombuffer(raw, dtype=np.uint8)
    if a.size == 0:
        return 0
    idx = np.arange(a.size, dtype=np.int32)
    last_other = np.maximum.accumulate(np.where(a == 0x5C, np.int32(-1), idx))  # last non-backslash <= i
    run = np.zeros(a.size, dtype=np.int32)
    run[1:] = idx[:-1] - last_other[:-1]  # backslashes just before i
    quote = (a == 0x22) & (run % 2 == 0)
    inside = (np.cumsum(quote, dtype=np.int32) - quote) % 2 == 1
    step = _STEP[a]
    step[inside] = 0
    return max(0, int(np.cumsum(step, dtype=np.int32).max()))


def decode(raw: bytes, max_depth: int) -> Any:
    """The JSON value of `raw`; 400 when it nests deeper than `max_depth` or is not JSON."""
    depth = json_depth(raw)
    if depth > max_depth:
        raise ApiError(
            400,
            f"request body nests {depth} levels deep; this server's limit is {max_depth} (serve.limits.max_json_depth)",
            code="nesting_too_deep",
        )
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ApiError(400, "request body is not valid JSON") from None
    except RecursionError:  # unreachable below max_depth; kept so no traceback ever leaves
        raise ApiError(400, "request body nests too deeply", code="nesting_too_deep") from None
    except ValueError as exc:  # an integer of over 4,300 digits (Python's int-to-str limit)
        raise ApiError(400, f"request body is not usable JSON: {str(exc)[:120]}") from None
    _refuse_surrogates(value)
    return value


def _refuse_surrogates(value: Any) -> None:
    """400 when a string of the decoded body holds a lone surrogate (a `\\ud800` escape with no
    pair), which is not text and which the tokenizer cannot take. One linear re-encoding of a
    value already bounded in size and depth."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(
            400, "request body holds a lone surrogate escape (\\ud800-\\udfff), which is not text", code="invalid_text"
        ) from None


def validate(raw: bytes, model: type[BaseModel], limits: LimitsConfig) -> Any:
    """`raw` decoded and validated as `model`, then checked against `limits` (runs off the loop)."""
    data = decode(raw, limits.max_json_depth)
    if not isinstance(data, dict):
        raise ApiError(400, "request body must be a JSON object")
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(x) for x in err["loc"]) or None
        code = err["type"] if err["type"] in ("invalid_content", "invalid_content_part") else None
        raise ApiError(400, f"{param}: {err['msg']}" if param else err["msg"], param=param, code=code) from None
    if isinstance(body, ChatRequest):
        check_chat(body, limits)
    elif isinstance(body, CompletionRequest):
        check_completion(body, limits)
    return body


def _limit(what: str, got: int, limit: int, field: str, param: str | None) -> ApiError:
    return ApiError(
        400,
        f"{what} {got} exceeds this server's limit of {limit} (serve.limits.{field})",
        param=param,
        code="limit_exceeded",
    )


def check_n(n: int, limits: LimitsConfig) -> None:
    """400 naming the limit when a request asks for more than `max_n` choices per prompt."""
    if n > limits.max_n:
        raise _limit("n", n, limits.max_n, "max_n", "n")


def check_chat(body: ChatRequest, limits: LimitsConfig) -> None:
    """400 naming the limit when a chat request has too many messages, parts, characters or
    images; then each image part's data URL decoded into its `Image` (serve.images: 400 naming
    the rule for a remote URL, another scheme, an oversized image or one that is not a PNG)."""
    check_n(body.n, limits)
    parts = sum(1 if isinstance(m.content, str) else max(1, len(m.content)) for m in body.messages)
    if parts > limits.max_messages:
        raise _limit("messages (and content parts)", parts, limits.max_messages, "max_messages", "messages")
    chars = sum(len(m.text()) for m in body.messages)
    if chars > limits.max_prompt_chars:
        raise _limit("prompt characters", chars, limits.max_prompt_chars, "max_prompt_chars", "messages")
    images = [
        (f"messages.{i}.content.{j}.image_url.url", p)
        for i, m in enumerate(body.messages)
        if not isinstance(m.content, str)
        for j, p in enumerate(m.content)
        if isinstance(p, ImagePart)
    ]
    if len(images) > limits.max_images:
        raise _limit("images", len(images), limits.max_images, "max_images", "messages")
    for param, part in images:
        part.attach(decode_image_url(part.image_url.url, limits.max_image_bytes, limits.max_image_pixels, param))


def check_completion(body: CompletionRequest, limits: LimitsConfig) -> None:
    """400 naming the limit when a completions request has too many prompts, choices, characters or token ids."""
    check_n(body.n, limits)
    prompts = body.prompts()
    if len(prompts) > limits.max_prompts:
        raise _limit("prompts", len(prompts), limits.max_prompts, "max_prompts", "prompt")
    if len(prompts) * body.n > limits.max_choices:
        raise _limit("choices (n x prompts)", len(prompts) * body.n, limits.max_choices, "max_choices", "n")
    chars = sum(len(p) for p in prompts if isinstance(p, str))
    if chars > limits.max_prompt_chars:
        raise _limit("prompt characters", chars, limits.max_prompt_chars, "max_prompt_chars", "prompt")
    for p in prompts:
        if not isinstance(p, str):
            check_tokens(len(p), limits)


def check_tokens(n: int, limits: LimitsConfig) -> None:
    """400 naming the limit when one prompt has more than `max_prompt_tokens` tokens."""
    if n > limits.max_prompt_tokens:
        raise _limit("prompt tokens", n, limits.max_prompt_tokens, "max_prompt_tokens", "prompt")


async def receive_body(scope: Any, receive: Any, limit: int, timeout_s: float) -> bytes:
    """The whole body of an ASGI request, refused like `read_body` (413 over `limit` bytes, by
    Content-Length or by the bytes received; 408 when it has not all arrived within `timeout_s`;
    400 when the client disconnects first)."""
    declared = dict(scope.get("headers") or []).get(b"content-length")
    check_declared_length(None if declared is None else declared.decode("latin-1"), limit)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ApiError(400, "client disconnected before sending its whole body", code="client_disconnected")
                size += len(message.get("body", b""))
                if size > limit:
                    raise too_large(limit)
                chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    return b"".join(chunks)
    except TimeoutError:
        raise too_slow(timeout_s) from None


def _replay(body: bytes, receive: Any) -> Any:
    """An ASGI receive that gives `body` once, then what `receive` gives (the disconnect)."""
    sent = False

    async def again() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


class Admission:
    """ASGI middleware: at most `limit` requests on `paths` at once, each counted from the
    moment its whole body has arrived (read here, bounded by `max_body_bytes` and
    `body_timeout_s`) to its response's last byte (streams included); one more gets 429 at
    once. A request still sending its body holds no slot."""

    def __init__(
        self, app: Any, limit: int, paths: frozenset[str], refused: Counter, limits: LimitsConfig | None = None
    ) -> None:
        self.app, self.limit, self.paths, self.refused = app, limit, paths, refused
        self.limits = limits or LimitsConfig.model_validate({})
        self.inflight = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        try:
            body = await receive_body(scope, receive, self.limits.max_body_bytes, self.limits.body_timeout_s)
        except ApiError as exc:
            self.refused.inc(endpoint=scope["path"], status=exc.status, code=exc.code or "invalid_request")
            await JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)(scope, receive, send)
            return
        receive = _replay(body, receive)
        if self.inflight >= self.limit:
            self.refused.inc(endpoint=scope["path"], status=429, code="too_many_requests")
            err = ApiError(
                429,
                f"server busy: {self.inflight} requests in flight, the limit is {self.limit} "
                "(serve.limits.max_inflight); retry later",
                "rate_limit_error",
                code="too_many_requests",
            )
            await JSONResponse(err.body(), status_code=429, headers={"Retry-After": "1"})(scope, receive, send)
            return
        self.inflight += 1
        scope[ADMITTED] = True  # serve/connections.py: this connection is serving, not stalled
        try:
            await self.app(scope, receive, send)
        finally:
            self.inflight -= 1


class Offload:
    """A fixed pool of worker threads for CPU-heavy request work (parsing, tokenizing)."""

    def __init__(self, threads: int) -> None:
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="serve-work")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a worker thread; the event loop waits without blocking."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
